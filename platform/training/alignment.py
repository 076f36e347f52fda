"""A vertical job's record alignment at the coordinator: the parties' digests compared.

Before the first turn of a vertical job, its parties align their records by private set
intersection over the relay (``hospital_agent/alignment.py``); the coordinator never sees
an identifier. Each party then reports the digest (SHA-256 of the ordered intersection)
and the size of what it holds. Once every participant has:

- all digests equal: ``agreed`` (audit ``alignment.agreed``, the size only); the agents
  go on to train;
- any differs: ``mismatch``: the job fails, its reason naming that the parties hold
  different intersections (audit ``alignment.mismatch``);

and as soon as the label party (the first participant) reports an intersection below the
job's minimum (its mode's ``min_records``): ``too_small``, the job fails.

A party reporting the same digest again changes nothing (a restarted agent does); one
reporting another digest than before holds other records now: that is a mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.actors import Actor
from kernel.errors import InvalidInput, NotFound
from kernel.permissions import require_agent
from medsplit.errors import ConfigError
from training.models import Job, JobAlignment
from training.services import job_transition
from training.states import TERMINAL, JobState

_DIGEST = re.compile(r"[0-9a-f]{64}")
#: The mode option a vertical job's minimum intersection comes from.
MINIMUM_OPTION = "min_records"
#: Past this many records no party holds (medsplit.psi's bound on identifiers).
MAX_SIZE = 10_000_000


def job_minimum(job: Job) -> int:
    """The smallest intersection ``job`` trains on: its mode's ``min_records`` option
    (filled in with the mode's default where the job does not say)."""
    try:
        return int(job.training_config().mode_options[MINIMUM_OPTION])
    except (ConfigError, KeyError) as e:
        raise InvalidInput(
            f"job {job.pk} aligns no records: its mode takes no {MINIMUM_OPTION} ({e})"
        ) from e


def aligned_size(job: Job) -> int | None:
    """The size of ``job``'s agreed intersection (every step's records come from it),
    or ``None`` while its parties have not agreed."""
    alignment = JobAlignment.objects.filter(job=job, status=JobAlignment.Status.AGREED).first()
    return None if alignment is None else alignment.size


def alignment_report(*, actor: Actor, job_id: int, digest: str, size: int) -> JobAlignment:
    """The calling agent holds an intersection of ``size`` records with ``digest``:
    record it, and decide once every participant has (see the module docstring).

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such job of the agent's.
        InvalidInput: a malformed digest or size.
    """
    require_agent(actor, "report a record alignment")
    problems: dict[str, list[str]] = {}
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        problems["digest"] = ["must be 64 lower-case hex digits"]
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SIZE:
        problems["size"] = [f"must be an integer from 0 to {MAX_SIZE:,}"]
    if problems:
        raise InvalidInput("the alignment report is not valid", details=problems)
    slug = actor.hospital.slug
    with transaction.atomic():
        if not Job.objects.filter(pk=job_id, participants__hospital=actor.hospital).exists():
            raise NotFound(f"no job {job_id} of yours")
        job = Job.objects.select_for_update().get(pk=job_id)
        alignment = _locked_alignment(job)
        if alignment.status in (JobAlignment.Status.MISMATCH, JobAlignment.Status.TOO_SMALL):
            return alignment  # decided: the agent reads why
        known = alignment.reports.get(slug)
        if known is not None and known["digest"] == digest and known["size"] == size:
            return alignment
        now = timezone.now()
        alignment.reports = {
            **alignment.reports,
            slug: {"digest": digest, "size": size, "at": now.isoformat()},
        }
        alignment.save(update_fields=["reports"])
        if known is not None:
            return _mismatch(
                job,
                alignment,
                [slug],
                f"{slug} reported another intersection than before (its records changed)",
            )
        if slug == _label_party(job) and size < alignment.minimum:
            return _too_small(job, alignment, size)
        return _decide(job, alignment)


def alignment_get(*, actor: Actor, job_id: int) -> dict[str, Any]:
    """The job's alignment state, for one of its agents.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such job of the agent's.
    """
    require_agent(actor, "read a record alignment")
    job = Job.objects.filter(pk=job_id, participants__hospital=actor.hospital).first()
    if job is None:
        raise NotFound(f"no job {job_id} of yours")
    return alignment_state(job)


def alignment_summary(job: Job) -> dict[str, Any] | None:
    """:func:`alignment_state` of a job whose parties align records (pending before any
    reported), ``None`` for a job of another mode: ``GET /api/jobs/{id}/``'s
    ``alignment``."""
    alignment = JobAlignment.objects.filter(job=job).first()
    if alignment is not None:
        return alignment_state(job, alignment)
    try:
        aligning = job.training_config().split_mode.feature_sets
    except ConfigError:  # a mode this coordinator no longer knows
        aligning = False
    return alignment_state(job) if aligning else None


def alignment_state(job: Job, alignment: JobAlignment | None = None) -> dict[str, Any]:
    """What anyone who sees ``job`` may see of its alignment: status, size, how many
    parties reported, the minimum and why it failed; never a digest. ``status`` is
    ``failed`` while undecided in an ended job."""
    alignment = alignment or JobAlignment.objects.filter(job=job).first()
    if alignment is None:
        status = "failed" if job.state in TERMINAL else JobAlignment.Status.PENDING.value
        return {
            "status": status,
            "size": None,
            "reported": 0,
            "parties": job.participants.count(),
            "minimum": job_minimum(job),
            "reason": job.state_reason if status == "failed" else "",
        }
    status = alignment.status
    reason = alignment.reason
    if status == JobAlignment.Status.PENDING and job.state in TERMINAL:
        status, reason = "failed", f"the job is {job.state}: {job.state_reason}".rstrip(": ")
    return {
        "status": status,
        "size": alignment.size,
        "reported": len(alignment.reports),
        "parties": job.participants.count(),
        "minimum": alignment.minimum,
        "reason": reason,
    }


# -- deciding -------------------------------------------------------------------------


def _locked_alignment(job: Job) -> JobAlignment:
    alignment = JobAlignment.objects.select_for_update().filter(job=job).first()
    if alignment is None:
        alignment = JobAlignment.objects.create(
            job=job, minimum=job_minimum(job), created_at=timezone.now()
        )
    return alignment


def _label_party(job: Job) -> str:
    first = job.participants.select_related("hospital").order_by("position").first()
    return first.hospital.slug if first is not None else ""


def _decide(job: Job, alignment: JobAlignment) -> JobAlignment:
    slugs = list(job.participants.order_by("position").values_list("hospital__slug", flat=True))
    if not all(slug in alignment.reports for slug in slugs):
        return alignment
    label = slugs[0]
    expected = alignment.reports[label]["digest"]
    differ = [s for s in slugs if alignment.reports[s]["digest"] != expected]
    if differ:
        return _mismatch(
            job, alignment, differ, f"{', '.join(differ)} hold another intersection than {label}"
        )
    alignment.status = JobAlignment.Status.AGREED
    alignment.size = alignment.reports[label]["size"]
    alignment.decided_at = timezone.now()
    alignment.save(update_fields=["status", "size", "decided_at"])
    _audit("alignment.agreed", job, {"size": alignment.size})
    return alignment


def _mismatch(job: Job, alignment: JobAlignment, hospitals: list[str], why: str) -> JobAlignment:
    reason = (
        f"record alignment: the parties hold different intersections ({why}); "
        "nothing is trained on unaligned records"
    )
    _fail(job, alignment, JobAlignment.Status.MISMATCH, reason)
    sizes = {s: r["size"] for s, r in alignment.reports.items()}
    _audit("alignment.mismatch", job, {"hospitals": hospitals, "sizes": sizes})
    return alignment


def _too_small(job: Job, alignment: JobAlignment, size: int) -> JobAlignment:
    alignment.size = size
    reason = (
        f"record alignment: the intersection is too small: the parties share {size:,} "
        f"records, below the job's minimum of {alignment.minimum:,} (so few could single "
        "out patients); nothing is trained"
    )
    _fail(job, alignment, JobAlignment.Status.TOO_SMALL, reason)
    _audit("alignment.too_small", job, {"size": size, "minimum": alignment.minimum})
    return alignment


def _fail(job: Job, alignment: JobAlignment, status: str, reason: str) -> None:
    alignment.status = status
    alignment.reason = reason
    alignment.decided_at = timezone.now()
    alignment.save(update_fields=["status", "size", "reason", "decided_at"])
    if job.state in (JobState.RUNNING, JobState.PAUSED):
        job_transition(job=job, to=JobState.FAILED, actor=Actor.system(), reason=reason)


def _audit(action: str, job: Job, details: Mapping[str, Any]) -> None:
    audit_record(
        actor=Actor.system(), action=action, target=f"job:{job.pk}", job_id=job.pk, details=details
    )
