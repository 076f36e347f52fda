"""A vertical job's label-leakage audit at the coordinator: what the label party reports.

After each round the label party (the job's first participant) has each passive party's
attack scores, sealed for it alone, and its own labels; it reports each attack's ROC AUC
per passive party (``hospital_agent/leakage.py``). The coordinator keeps those numbers,
audits them (``leakage.reported``) and serves them with the job; nothing else of the audit
reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from hospitals.models import Hospital
from kernel.actors import Actor
from kernel.errors import InvalidInput, NotFound, PermissionDenied
from kernel.permissions import require_agent
from training.models import Job, LabelLeakage

#: The attacks whose AUC a report carries.
ATTACKS = ("norm", "cosine")


def leakage_report(
    *, actor: Actor, job_id: int, round_index: int, parties: Mapping[str, Mapping[str, Any]]
) -> list[LabelLeakage]:
    """The label party's audit of round ``round_index``: for each passive party (by
    slug), the records scored and each attack's AUC (a number in [0, 1], or ``None`` where
    the labels are not binary). A report of the same round again replaces it.

    Raises:
        PermissionDenied: not an agent, or not the job's label party.
        NotFound: no such job of the agent's.
        InvalidInput: the job's mode audits no label leakage, a round the job does not
            have, a party that is not one of its passive parties, or a value out of range.
    """
    require_agent(actor, "report a label-leakage audit")
    job = Job.objects.filter(pk=job_id, participants__hospital=actor.hospital).first()
    if job is None:
        raise NotFound(f"no job {job_id} of yours")
    if not job.training_config().split_mode.feature_sets:
        raise InvalidInput(f"job {job_id} has no passive parties: it audits no label leakage")
    order = list(job.participants.order_by("position").values_list("hospital__slug", flat=True))
    if actor.hospital.slug != order[0]:
        raise PermissionDenied(
            "only the job's label party (its first participant) holds the labels the audit "
            "is scored against"
        )
    if not isinstance(round_index, int) or not 0 <= round_index < job.rounds:
        raise InvalidInput(f"round must be one of the job's rounds (0..{job.rounds - 1})")
    unknown = sorted(set(parties) - set(order[1:]))
    if unknown or not parties:
        raise InvalidInput(
            f"the audit covers the job's passive parties ({', '.join(order[1:])}), got "
            f"{', '.join(unknown) or 'none'}"
        )
    values = {slug: _checked(slug, entry) for slug, entry in parties.items()}
    hospitals = {h.slug: h for h in Hospital.objects.filter(slug__in=values)}
    rows = []
    with transaction.atomic():
        for slug, entry in sorted(values.items()):
            row, _ = LabelLeakage.objects.update_or_create(
                job=job,
                round_index=round_index,
                hospital=hospitals[slug],
                defaults={**entry, "reported_at": timezone.now()},
            )
            rows.append(row)
        audit_record(
            actor=actor,
            action="leakage.reported",
            target=f"job:{job.pk}",
            job_id=job.pk,
            details={"round": round_index, "parties": values},
        )
    return rows


def leakage_summary(job: Job) -> list[dict[str, Any]]:
    """Every reported round and passive party: ``GET /api/jobs/{id}/``'s
    ``label_leakage`` (empty for a job without passive parties)."""
    return [
        {
            "round": row.round_index,
            "hospital": row.hospital.slug,
            "records": row.records,
            "norm_auc": row.norm_auc,
            "cosine_auc": row.cosine_auc,
        }
        for row in LabelLeakage.objects.filter(job=job).select_related("hospital")
    ]


def _checked(slug: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or set(entry) != {"records", *(f"{a}_auc" for a in ATTACKS)}:
        raise InvalidInput(
            f"{slug}: give records and {', '.join(f'{a}_auc' for a in ATTACKS)}, nothing else"
        )
    records = entry["records"]
    if not isinstance(records, int) or isinstance(records, bool) or not 0 < records < 10**8:
        raise InvalidInput(f"{slug}: records must be a positive integer, got {records!r}")
    out: dict[str, Any] = {"records": records}
    for attack in ATTACKS:
        auc = entry[f"{attack}_auc"]
        ok = auc is None or (
            isinstance(auc, int | float)
            and not isinstance(auc, bool)
            and math.isfinite(auc)
            and 0.0 <= auc <= 1.0
        )
        if not ok:
            raise InvalidInput(f"{slug}: {attack}_auc must be in [0, 1] or null, got {auc!r}")
        out[f"{attack}_auc"] = None if auc is None else float(auc)
    return out
