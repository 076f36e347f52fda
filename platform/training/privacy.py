"""A job's privacy figures at the coordinator: what each hospital measured of itself.

With a job's ``privacy.audit`` on, each hospital's agent audits its own exposure at the
end of its turn every ``every_rounds`` rounds (and after its last one), on its own data,
with the job's front as it stands (``hospital_agent/privacy_report.py``); with
``privacy.activation_noise`` on it also tells the ε its noise has spent so far, after
every turn. It reports numbers only, and only about itself; the coordinator keeps them
(:class:`~training.models.PrivacyFigures`), audits them (``privacy.reported``) and serves
each hospital's to those who may see that hospital's part in full (the least-privilege
rule of :mod:`kernel.permissions`): its own admin, the consortium admins, the observers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent
from medsplit.modes import Side
from training.models import Job, PrivacyFigures, Turn

__all__ = [
    "AUDIT_FIELDS",
    "EPSILON_FIELDS",
    "LEAKAGE_FIELDS",
    "RANGES",
    "privacy_report",
    "privacy_rows",
]

#: Each number a report may carry and the range it must lie in (closed, finite).
RANGES: dict[str, tuple[float, float]] = {
    # SSIM is in [-1, 1]; images in [0, 1] make a PSNR of at least 0 dB, and the agent
    # caps an exact reconstruction's infinite one at the upper end.
    "ssim": (-1.0, 1.0),
    "psnr": (0.0, 200.0),
    "baseline_ssim": (-1.0, 1.0),
    "baseline_psnr": (0.0, 200.0),
    "distance_correlation": (0.0, 1.0),
    "norm_auc": (0.0, 1.0),
    "cosine_auc": (0.0, 1.0),
    "epsilon": (0.0, 1e6),
    # A δ above 1 says nothing: the agent reports at most 1.
    "delta_total": (0.0, 1.0),
    "noise_multiplier": (0.0, 1e4),
}
#: Counts of records, each a positive integer below this.
MAX_RECORDS = 10**8
#: What an inversion audit reports, all together.
AUDIT_FIELDS = (
    "ssim",
    "psnr",
    "baseline_ssim",
    "baseline_psnr",
    "distance_correlation",
    "train_records",
    "val_records",
)
#: What the label-leakage attacks report (the AUCs ``None`` where the labels are not
#: binary with both classes present), only where the labels stay at the hospital.
LEAKAGE_FIELDS = ("label_records", "norm_auc", "cosine_auc")
#: What the activation noise's accounting reports.
EPSILON_FIELDS = ("epsilon", "delta_total", "noise_multiplier")
_COUNTS = ("train_records", "val_records", "label_records")


def privacy_report(
    *, actor: Actor, job_id: int, round_index: int, figures: Mapping[str, Any]
) -> PrivacyFigures:
    """This hospital's figures of round ``round_index`` of a job it takes part in.

    A report holds whole groups (:data:`AUDIT_FIELDS`, :data:`LEAKAGE_FIELDS`,
    :data:`EPSILON_FIELDS`), each only where the job's privacy options measure it. One
    report per hospital and round: the same report again answers the stored one (an agent
    retrying), another one is refused.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such job of the agent's hospital.
        InvalidInput: a round the hospital took no turn in, a group the job does not
            measure or given in part, a name no group has, a number out of range.
        Conflict: the hospital already reported other figures for this round.
    """
    require_agent(actor, "report privacy figures")
    job = Job.objects.filter(pk=job_id, participants__hospital=actor.hospital).first()
    if job is None:
        raise NotFound(f"no job {job_id} of yours")
    if isinstance(round_index, bool) or not isinstance(round_index, int):
        raise InvalidInput("round must be an integer", details={"round": ["not an integer"]})
    if not Turn.objects.filter(job=job, round__index=round_index, hospital=actor.hospital).exists():
        raise InvalidInput(
            f"this hospital took no turn in round {round_index} of job {job_id}",
            details={"round": [f"no turn of yours in round {round_index}"]},
        )
    values = _checked(job, figures)
    with transaction.atomic():
        stored = PrivacyFigures.objects.filter(
            job=job, round_index=round_index, hospital=actor.hospital
        ).first()
        if stored is not None:
            return _same_or_conflict(stored, values, round_index)
        try:
            with transaction.atomic():
                row = PrivacyFigures.objects.create(
                    job=job,
                    round_index=round_index,
                    hospital=actor.hospital,
                    reported_at=timezone.now(),
                    **values,
                )
        except IntegrityError:  # the same report raced in: answer as for a repeat
            stored = PrivacyFigures.objects.get(
                job=job, round_index=round_index, hospital=actor.hospital
            )
            return _same_or_conflict(stored, values, round_index)
        audit_record(
            actor=actor,
            action="privacy.reported",
            target=f"job:{job.pk}",
            job_id=job.pk,
            details={"round": round_index, "figures": values},
        )
    return row


def privacy_rows(job: Job, *, hospital_ids: set[int] | None) -> list[dict[str, Any]]:
    """The job's figures per round and hospital, of the hospitals in ``hospital_ids``
    (``None``: all), each with the ε target and δ of the job's activation noise.

    The selector :func:`training.selectors.privacy_figures` decides who sees which.
    """
    noise = job.job_description().privacy.activation_noise
    rows = PrivacyFigures.objects.filter(job=job).select_related("hospital")
    if hospital_ids is not None:
        rows = rows.filter(hospital_id__in=hospital_ids)
    out = []
    for row in rows.order_by("round_index", "hospital__slug"):
        entry: dict[str, Any] = {"round": row.round_index, "hospital": row.hospital.slug}
        for name in (*AUDIT_FIELDS, *LEAKAGE_FIELDS, *EPSILON_FIELDS):
            entry[name] = getattr(row, name)
        entry["target_epsilon"] = noise.target_epsilon if noise else None
        entry["delta"] = noise.delta if noise else None
        entry["reported_at"] = row.reported_at.isoformat()
        out.append(entry)
    return out


def _checked(job: Job, figures: Mapping[str, Any]) -> dict[str, Any]:
    """The report's values, each group whole and measured by the job, in range."""
    if not isinstance(figures, Mapping):
        raise InvalidInput("the figures are a JSON object", details={"figures": ["not an object"]})
    options = job.job_description().privacy
    labels_home = job.training_config().split_mode.labels is Side.HOSPITAL
    groups = {
        "audit": (AUDIT_FIELDS, options.audit is not None, "privacy.audit is off"),
        "leakage": (
            LEAKAGE_FIELDS,
            options.audit is not None and labels_home,
            "its labels do not stay at the hospitals, or privacy.audit is off",
        ),
        "epsilon": (EPSILON_FIELDS, options.activation_noise is not None, "no activation noise"),
    }
    known = {name for names, _, _ in groups.values() for name in names}
    problems: dict[str, list[str]] = {}
    for name in sorted(set(map(str, figures)) - known):
        problems[name] = ["unknown figure"]
    values: dict[str, Any] = {}
    for group, (names, measured, why_not) in groups.items():
        given = [n for n in names if n in figures]
        if not given:
            continue
        if not measured:
            for name in given:
                problems[name] = [f"job {job.pk} does not measure this ({why_not})"]
            continue
        missing = [n for n in names if n not in figures]
        if missing:
            for name in missing:
                problems[name] = [f"the {group} figures come together: this one is missing"]
            continue
        for name in names:
            value, problem = _value(name, figures[name], nullable=name.endswith("_auc"))
            if problem:
                problems[name] = [problem]
            else:
                values[name] = value
    if not values and not problems:
        problems["figures"] = ["no figure given"]
    if problems:
        raise InvalidInput(
            f"the privacy figures are not valid: see {', '.join(sorted(problems))}",
            details=problems,
        )
    return values


def _value(name: str, value: object, *, nullable: bool) -> tuple[Any, str | None]:
    if value is None:
        return (None, None) if nullable else (None, "a number is required")
    if name in _COUNTS:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_RECORDS
        return (value, None) if ok else (None, f"a positive integer below {MAX_RECORDS}")
    low, high = RANGES[name]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low <= value <= high:  # type: ignore[arg-type]
        return None, f"a finite number in [{low:g}, {high:g}], got {value!r}"
    return float(value), None  # type: ignore[arg-type]


def _same_or_conflict(
    stored: PrivacyFigures, values: Mapping[str, Any], round_index: int
) -> PrivacyFigures:
    names = (*AUDIT_FIELDS, *LEAKAGE_FIELDS, *EPSILON_FIELDS)
    if all(getattr(stored, n) == values.get(n) for n in names):
        return stored
    raise Conflict(
        f"this hospital already reported its privacy figures of round {round_index}; a "
        "round's figures are reported once"
    )
