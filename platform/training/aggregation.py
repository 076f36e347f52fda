"""Services of secure aggregation rounds: the hospitals' submissions, the worker's sum,
and what happens when a hospital drops or a submission is refused.

The first attempt of a group's aggregation is opened by the scheduler
(:func:`training.services.aggregation_open`, once the group's turns ended). Then:

* each hospital's agent reports its masked submission (:func:`aggregation_submit`:
  SHA-256, size and its public integer buffers; the vector itself is on the relay);
* once all have, a worker claims the attempt (:func:`aggregation_claim`), sums the
  vectors it reads off the relay and reports the aggregate (:func:`aggregation_done`);
* a submission the worker refuses (:func:`aggregation_refused`) or a hospital missing at
  the deadline (:func:`aggregations_overdue`) is left to the job's failure policy:
  ``skip`` restarts the round without that hospital (a new attempt, fresh seeds),
  ``retry`` restarts it with the same hospitals (up to ``max_retries`` times), ``fail``
  fails the job naming the hospital. Nothing is averaged from a failed attempt.

Every step is audited with sizes and digests, never values. Each function runs in one
transaction and locks the job's row before the aggregation's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent
from medsplit.errors import UnknownModeError
from medsplit.modes import get_mode
from training.dispatch import job_changed_on_commit
from training.models import Aggregation, Job, OnFailure, Turn
from training.services import job_transition, turn_fail
from training.states import JobState

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: At most this many integer buffers (BatchNorm counters) per submission.
MAX_COUNTS = 4096
#: A worker that claimed an attempt and went silent this long gives it back.
SUMMING_LEASE = timedelta(minutes=5)


def _audit(action: str, aggregation: Aggregation, details: Mapping[str, Any], **kw: Any) -> None:
    audit_record(
        actor=kw.pop("actor", Actor.system()),
        action=action,
        target=f"aggregation:{aggregation.pk}",
        job_id=aggregation.job_id,
        details={
            "round": aggregation.round_index,
            "group": aggregation.group,
            "attempt": aggregation.attempt,
            **details,
        },
        **kw,
    )


def _locked(aggregation_id: int) -> tuple[Job, Aggregation]:
    job_id = Aggregation.objects.filter(pk=aggregation_id).values_list("job_id", flat=True).first()
    if job_id is None:
        raise NotFound(f"no aggregation {aggregation_id}")
    job = Job.objects.select_for_update().get(pk=job_id)
    return job, Aggregation.objects.select_for_update().get(pk=aggregation_id)


def aggregation_submit(
    *,
    actor: Actor,
    job_id: int,
    round_index: int,
    attempt: int,
    sha256: str,
    size_bytes: int,
    counts: Mapping[str, Any],
) -> Aggregation:
    """The calling agent put its masked submission for ``round_index`` (``attempt``) on
    the relay: record its digest, size and integer buffers; once every participant has,
    the scheduler sends the attempt to a worker.

    Reporting the same digest again changes nothing.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such attempt of the agent's jobs.
        InvalidInput: a malformed digest, size or counts.
        Conflict: the attempt is not collecting (summed, restarted, failed), the hospital
            is not one of its participants, or it reported another digest before.
    """
    require_agent(actor, "submit to a secure aggregation")
    problems: dict[str, list[str]] = {}
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        problems["sha256"] = ["must be 64 lower-case hex digits"]
    if not isinstance(size_bytes, int) or isinstance(size_bytes, bool) or size_bytes < 1:
        problems["size_bytes"] = ["must be a positive integer"]
    if not _counts_ok(counts):
        problems["counts"] = [
            f"must map at most {MAX_COUNTS} buffer names to lists of non-negative integers"
        ]
    if problems:
        raise InvalidInput("the submission record is not valid", details=problems)
    slug = actor.hospital.slug
    with transaction.atomic():
        if not Job.objects.filter(pk=job_id, participants__hospital=actor.hospital).exists():
            raise NotFound(f"no job {job_id} of yours")
        job = Job.objects.select_for_update().get(pk=job_id)
        aggregation = (
            Aggregation.objects.select_for_update()
            .filter(job=job, round_index=round_index, attempt=attempt)
            .first()
        )
        if aggregation is None:
            raise NotFound(
                f"no aggregation of round {round_index} attempt {attempt} in job {job_id}"
            )
        if slug not in aggregation.weights:
            raise Conflict(
                f"{slug} is not a participant of round {round_index} attempt {attempt} "
                f"({sorted(aggregation.weights)})",
                details={"participants": sorted(aggregation.weights)},
            )
        known = aggregation.submissions.get(slug)
        if known is not None:
            if known["sha256"] == sha256:
                return aggregation
            raise Conflict(
                f"{slug} already submitted {known['sha256'][:16]}... in round {round_index} "
                f"attempt {attempt}; a second vector under the same masks would reveal the "
                "difference of the two, so it is refused",
                details={"sha256": known["sha256"]},
            )
        if aggregation.status != Aggregation.Status.COLLECTING or job.state != JobState.RUNNING:
            raise Conflict(
                f"round {round_index} attempt {attempt} is {aggregation.status} (job "
                f"{job.state}); it takes no submissions",
                details={"status": aggregation.status},
            )
        aggregation.submissions = {
            **aggregation.submissions,
            slug: {
                "sha256": sha256,
                "size_bytes": size_bytes,
                "counts": dict(counts),
                "at": timezone.now().isoformat(),
            },
        }
        aggregation.save(update_fields=["submissions"])
        _audit(
            "aggregation.submitted",
            aggregation,
            {"sha256": sha256, "size_bytes": size_bytes},
            actor=actor,
            hospital=slug,
        )
        if set(aggregation.submissions) == set(aggregation.weights):
            job_changed_on_commit(job.pk)
    return aggregation


def _counts_ok(counts: object) -> bool:
    if not isinstance(counts, Mapping) or len(counts) > MAX_COUNTS:
        return False
    for name, values in counts.items():
        if not isinstance(name, str) or not 0 < len(name) <= 300 or not isinstance(values, list):
            return False
        if len(values) > 64 or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 for v in values
        ):
            return False
    return True


def aggregations_to_sum(*, job_id: int | None = None, now: datetime | None = None) -> list[int]:
    """Attempts every participant submitted to, not sent to a worker within the lease (a
    worker that claimed one and died gives it back after :data:`SUMMING_LEASE`)."""
    now = now or timezone.now()
    rows = Aggregation.objects.filter(
        status__in=(Aggregation.Status.COLLECTING, Aggregation.Status.SUMMING),
        job__state=JobState.RUNNING,
    )
    if job_id is not None:
        rows = rows.filter(job_id=job_id)
    ready = []
    for row in rows:
        if set(row.submissions) != set(row.weights):
            continue
        if row.dispatched_at is not None and row.dispatched_at > now - SUMMING_LEASE:
            continue
        ready.append(row.pk)
    return ready


def aggregation_dispatched(*, aggregation_id: int) -> None:
    """Note that a summing task was sent for the attempt."""
    Aggregation.objects.filter(pk=aggregation_id).update(dispatched_at=timezone.now())


def aggregation_claim(*, aggregation_id: int) -> Aggregation | None:
    """Take a complete attempt for summing; ``None`` when it is not (yet, or any more) to
    be summed (a duplicate task)."""
    with transaction.atomic():
        job, aggregation = _locked(aggregation_id)
        complete = set(aggregation.submissions) == set(aggregation.weights)
        if job.state != JobState.RUNNING or not complete:
            return None
        if aggregation.status not in (Aggregation.Status.COLLECTING, Aggregation.Status.SUMMING):
            return None
        aggregation.status = Aggregation.Status.SUMMING
        aggregation.dispatched_at = timezone.now()
        aggregation.save(update_fields=["status", "dispatched_at"])
    return aggregation


def aggregation_done(*, aggregation_id: int, sha256: str, size_bytes: int) -> Aggregation:
    """The worker put the aggregate on every participant's stream: the round goes on.

    Raises:
        Conflict: the attempt is not being summed.
    """
    with transaction.atomic():
        job, aggregation = _locked(aggregation_id)
        if aggregation.status != Aggregation.Status.SUMMING:
            raise Conflict(f"{aggregation} is not being summed")
        aggregation.status = Aggregation.Status.DONE
        aggregation.aggregate_sha256 = sha256
        aggregation.aggregate_size_bytes = size_bytes
        aggregation.finished_at = timezone.now()
        aggregation.save(
            update_fields=["status", "aggregate_sha256", "aggregate_size_bytes", "finished_at"]
        )
        _audit(
            "aggregation.done",
            aggregation,
            {
                "participants": sorted(aggregation.weights),
                "weights": aggregation.weights,
                "sha256": sha256,
                "size_bytes": size_bytes,
                "submitted_bytes": sum(s["size_bytes"] for s in aggregation.submissions.values()),
            },
        )
        job_changed_on_commit(job.pk)
    return aggregation


def aggregation_refused(*, aggregation_id: int, hospital: str, reason: str) -> Aggregation:
    """The worker refused ``hospital``'s submission (malformed, another round, a replay):
    nothing is averaged; the job's failure policy decides (see the module docstring)."""
    return _left_out(aggregation_id, [hospital], f"its submission was refused: {reason}")


def aggregation_retry(*, aggregation_id: int, reason: str) -> Aggregation:
    """The summing failed for want of the relay or the database (not any hospital): the
    same hospitals again, in a new attempt (their seeds are fresh)."""
    with transaction.atomic():
        job, aggregation = _locked(aggregation_id)
        if aggregation.status not in (Aggregation.Status.COLLECTING, Aggregation.Status.SUMMING):
            return aggregation
        return _restart(job, aggregation, dropped=[], reason=reason)


def aggregations_overdue(*, now: datetime | None = None) -> list[Aggregation]:
    """Leave out, under each job's policy, the hospitals that have not submitted to an
    attempt past its deadline; the attempts acted on."""
    now = now or timezone.now()
    acted = []
    for row in Aggregation.objects.filter(
        status=Aggregation.Status.COLLECTING, job__state=JobState.RUNNING, deadline_at__lte=now
    ):
        missing = sorted(set(row.weights) - set(row.submissions))
        if missing:
            acted.append(_left_out(row.pk, missing, "it had not submitted by the round's deadline"))
    return acted


def _left_out(aggregation_id: int, hospitals: list[str], why: str) -> Aggregation:
    with transaction.atomic():
        job, aggregation = _locked(aggregation_id)
        if aggregation.status not in (Aggregation.Status.COLLECTING, Aggregation.Status.SUMMING):
            return aggregation
        names = ", ".join(hospitals)
        where = f"round {aggregation.round_index} attempt {aggregation.attempt}"
        reason = f"secure aggregation of {where}: {names}: {why}"
        if job.on_failure == OnFailure.SKIP and set(aggregation.weights) - set(hospitals):
            return _restart(job, aggregation, dropped=hospitals, reason=reason)
        if job.on_failure == OnFailure.RETRY and aggregation.attempt < job.max_retries:
            return _restart(job, aggregation, dropped=[], reason=reason)
        aggregation.status = Aggregation.Status.FAILED
        aggregation.failure_reason = reason[:2000]
        aggregation.finished_at = timezone.now()
        aggregation.save(update_fields=["status", "failure_reason", "finished_at"])
        job_transition(
            job=job, to=JobState.FAILED, actor=Actor.system(), reason=f"{reason}; nothing averaged"
        )
        _audit("aggregation.failed", aggregation, {"hospitals": hospitals, "reason": reason})
    return aggregation


def _restart(job: Job, aggregation: Aggregation, *, dropped: list[str], reason: str) -> Aggregation:
    """End ``aggregation`` and open its next attempt without ``dropped``."""
    now = timezone.now()
    aggregation.status = Aggregation.Status.RESTARTED
    aggregation.failure_reason = reason[:2000]
    aggregation.finished_at = now
    aggregation.save(update_fields=["status", "failure_reason", "finished_at"])
    weights = {h: w for h, w in aggregation.weights.items() if h not in dropped}
    following = Aggregation.objects.create(
        job=job,
        round_index=aggregation.round_index,
        group=aggregation.group,
        attempt=aggregation.attempt + 1,
        weights=weights,
        dropped=[{"hospital": h, "reason": reason[:500]} for h in dropped],
        created_at=now,
        deadline_at=now + timedelta(seconds=job.round_deadline_seconds),
    )
    _audit(
        "aggregation.restarted",
        aggregation,
        {
            "reason": reason,
            "dropped": dropped,
            "next_attempt": following.attempt,
            "weights": weights,
        },
    )
    return following


def turns_overdue(*, now: datetime | None = None) -> list[int]:
    """Fail, under each job's policy, the turns of parallel rounds (a mode that aggregates
    securely) still running past their job's round deadline: stragglers that would hold
    the round up. The turns failed."""
    now = now or timezone.now()
    failed = []
    running = Turn.objects.filter(
        status=Turn.Status.RUNNING, job__state=JobState.RUNNING, started_at__isnull=False
    ).select_related("job")
    for turn in running:
        try:
            if not get_mode(turn.job.mode).secure_aggregation:
                continue
        except UnknownModeError:
            continue  # its worker fails the turn, naming the mode
        limit = timedelta(seconds=turn.job.round_deadline_seconds)
        if turn.started_at + limit > now:
            continue
        turn_fail(
            turn=turn,
            reason=f"the round's deadline ({turn.job.round_deadline_seconds} s) passed before "
            "this hospital's turn ended (a straggler)",
        )
        job_changed_on_commit(turn.job_id)
        failed.append(turn.pk)
    return failed
