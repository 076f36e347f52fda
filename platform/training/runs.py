"""Services of a turn's server side: a worker's hold on the turn (its lease), what the
worker asks before every step, the checkpoints it writes, and the turn's completion.

A worker *claims* a running turn for ``lease_seconds`` and renews the claim while it
works. A worker that is killed stops renewing; once its lease has expired the scheduler's
sweep sends the turn to another worker, which claims it (audited as a take-over) and
continues from the last checkpoint. Two workers never hold one turn: claims and renewals
are conditional updates under the turn's row lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_record
from kernel.actors import Actor
from medsplit.errors import RoundPlanError
from medsplit.modes import StartFrom, get_mode
from medsplit.turns import Directive
from medsplit.turns.stores import StoreError, read_verified, write_atomic
from training.models import Job, ServerCheckpoint, Turn
from training.plan import job_result, turn_start
from training.services import turn_finish
from training.states import JobState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnClaim:
    """A turn a runner now holds, with what it needs to run it."""

    turn: Turn
    job: Job
    round_index: int
    #: Another runner held the turn and did not give it back (it died or hung).
    taken_over: bool = False


def turn_claim(
    *, turn_id: int, runner: str, lease_seconds: float, now: datetime | None = None
) -> TurnClaim | None:
    """Take turn ``turn_id`` for ``runner`` unless another runner's lease is still live.

    Returns:
        The claim; ``None`` when the turn is not running, its job is not running, or
        another runner holds it (a duplicate task, which then does nothing).
    """
    now = now or timezone.now()
    job_id = Turn.objects.filter(pk=turn_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)  # job first, then turn
        turn = Turn.objects.select_for_update().select_related("hospital", "round").get(pk=turn_id)
        if turn.status != Turn.Status.RUNNING or job.state != JobState.RUNNING:
            return None
        live = turn.lease_expires_at is not None and turn.lease_expires_at > now
        if turn.runner and turn.runner != runner and live:
            return None
        previous = turn.runner if turn.runner != runner else ""
        turn.runner = runner
        turn.lease_expires_at = now + timedelta(seconds=lease_seconds)
        turn.runs += 1
        turn.save(update_fields=["runner", "lease_expires_at", "runs"])
        if previous:
            audit_record(
                actor=Actor.system(),
                action="turn.taken_over",
                target=f"turn:{turn.pk}",
                hospital=turn.hospital.slug,
                job_id=job.pk,
                details={"from": previous, "to": runner, "reason": "the previous lease expired"},
            )
    return TurnClaim(turn=turn, job=job, round_index=turn.round.index, taken_over=bool(previous))


def turn_directive(*, turn_id: int, runner: str, lease_seconds: float, renew: bool) -> Directive:
    """What ``runner`` should do before its next step; renews its lease when ``renew``.

    ``stop`` when the turn is no longer running or no longer held by ``runner`` (the job
    was cancelled, the turn failed, another runner took it over), ``pause`` while the
    job is paused, else ``run``.
    """
    row = Turn.objects.filter(pk=turn_id).values_list("runner", "status", "job__state").first()
    if row is None:
        return Directive.STOP
    holder, status, job_state = row
    if status != Turn.Status.RUNNING or holder != runner:
        return Directive.STOP
    if job_state == JobState.PAUSED:
        return Directive.PAUSE
    if job_state != JobState.RUNNING:
        return Directive.STOP
    if renew:
        lease = timezone.now() + timedelta(seconds=lease_seconds)
        held = Turn.objects.filter(pk=turn_id, runner=runner, status=Turn.Status.RUNNING).update(
            lease_expires_at=lease
        )
        if not held:
            return Directive.STOP
    return Directive.RUN


def turn_retry_noted(*, turn: Turn, reason: str, retry_in: float) -> None:
    """Record that a run of ``turn`` ended on an infrastructure failure (the database, the
    relay, the storage) and that it runs again in ``retry_in`` seconds: the same attempt,
    from its last checkpoint, costing the job no retry."""
    audit_record(
        actor=Actor.system(),
        action="turn.run_interrupted",
        target=f"turn:{turn.pk}",
        hospital=turn.hospital.slug,
        job_id=turn.job_id,
        details={"reason": reason[:500], "retry_in_s": round(retry_in, 1), "runs": turn.runs},
    )


def turn_resumed_noted(*, turn: Turn, step: int, reason: str, runner: str) -> None:
    """Record that ``turn`` goes on from before ``step`` after a handshake other than its
    first start: ``reason`` says why (the hospital came back, a new run of the server), so
    that restarts of either side leave a trace an operator can follow."""
    audit_record(
        actor=Actor.system(),
        action="turn.resumed",
        target=f"turn:{turn.pk}",
        hospital=turn.hospital.slug,
        job_id=turn.job_id,
        details={"step": step, "reason": reason, "runner": runner, "runs": turn.runs},
    )


def last_retry_reason(*, turn: Turn) -> str:
    """Why the last run of ``turn`` was interrupted, if one was (see :func:`turn_retry_noted`)."""
    event = (
        AuditEvent.objects.filter(action="turn.run_interrupted", target=f"turn:{turn.pk}")
        .order_by("-id")
        .first()
    )
    return str(event.details.get("reason", "")) if event is not None else ""


def turn_release(*, turn_id: int, runner: str) -> None:
    """Give the turn up (paused, stopped, failed): the next runner need not wait."""
    Turn.objects.filter(pk=turn_id, runner=runner).update(runner="", lease_expires_at=None)


# -- checkpoints ------------------------------------------------------------------------

KEEP_PER_TURN = 2


def checkpoint_dir() -> Path:
    return Path(settings.MEDSPLIT["CHECKPOINT_DIR"])


def checkpoint_path(*, job_id: int, round_index: int, position: int, step: int) -> str:
    """Where a checkpoint's file lies, relative to ``MEDSPLIT["CHECKPOINT_DIR"]``."""
    return f"job-{job_id}/round-{round_index}-position-{position}-step-{step}.safetensors"


def checkpoints_of_place(*, job_id: int, round_index: int, position: int) -> QuerySet:
    """Checkpoints of one turn's place in a job (every attempt), oldest step first."""
    return ServerCheckpoint.objects.filter(
        job_id=job_id, round_index=round_index, position=position
    ).order_by("step")


def checkpoint_record(
    *, turn: Turn, round_index: int, step: int, path: str, sha256: str, size_bytes: int
) -> ServerCheckpoint:
    """Record a checkpoint file the runner wrote; keep the newest two of the turn's place.

    Files of dropped records are deleted once the transaction commits.
    """
    with transaction.atomic():
        checkpoint, _ = ServerCheckpoint.objects.update_or_create(
            job_id=turn.job_id,
            round_index=round_index,
            position=turn.position,
            step=step,
            defaults={
                "turn": turn,
                "path": path,
                "sha256": sha256,
                "size_bytes": size_bytes,
                "created_at": timezone.now(),
            },
        )
        place = checkpoints_of_place(
            job_id=turn.job_id, round_index=round_index, position=turn.position
        )
        keep = list(place.order_by("-step").values_list("pk", flat=True)[:KEEP_PER_TURN])
        job_checkpoint = Job.objects.filter(pk=turn.job_id).values_list(
            "server_checkpoint_id", flat=True
        )
        _delete_checkpoints(place.exclude(pk__in=keep).exclude(pk__in=job_checkpoint))
    return checkpoint


def turn_complete(
    *,
    turn: Turn,
    metrics: dict[str, float],
    crossed: dict | None = None,
    combine: Callable[[list[bytes]], bytes] | None = None,
    own_checkpoint: bool = True,
) -> Turn:
    """Finish the turn (:func:`training.services.turn_finish`) and make its last
    checkpoint the job's server state, which the next turn starts from; drop the rest.

    When this turn ends the job's last round and the job's mode makes its result of the
    last group (:meth:`~medsplit.modes.SplitMode.result_from`), the job's server state
    becomes ``combine`` of the group's last checkpoints instead (the server's exported
    parties from each, in position order), in the same transaction: a failure to combine
    leaves the turn running, to be served again.

    Without ``own_checkpoint`` (turns that share one server segment, SFLV2) the job's
    server state stays where the group's task recorded it (:func:`shared_end_record`).
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=turn.job_id)
        finished = turn_finish(turn=turn, metrics=metrics, crossed=crossed)
        round_index = finished.round.index
        latest = (
            checkpoints_of_place(job_id=job.pk, round_index=round_index, position=finished.position)
            .order_by("-step")
            .first()
        )
        if not own_checkpoint:
            latest = None
        own = latest
        result = _combined_result(job=job, finished=finished, combine=combine)
        if result is not None:
            latest = result
        if latest is not None and job.server_checkpoint_id != latest.pk:
            Job.objects.filter(pk=job.pk).update(server_checkpoint=latest)
        keep = latest.pk if latest is not None else job.server_checkpoint_id
        Turn.objects.filter(pk=turn.pk).update(runner="", lease_expires_at=None)
        # With a combined result, the group's ends it was made of stay too (this turn's
        # own end among them), as the record of what each turn left.
        stale = job.server_checkpoints.filter(~Q(pk__in=[keep, own.pk if own else keep]))
        for round_index, position in _places_still_needed(finished):
            stale = stale.exclude(round_index=round_index, position=position)
        _delete_checkpoints(stale)
    return finished


def _combined_result(
    *, job: Job, finished: Turn, combine: Callable[[list[bytes]], bytes] | None
) -> ServerCheckpoint | None:
    """The job's combined server result, recorded, if ``finished`` ended the job's last
    round and its mode combines the last group; else ``None``.

    It lies at the place one round past the last (round ``job.rounds``, position 0,
    step 0), the place a further round's turns would start from.

    Raises:
        StoreError: a checkpoint of the last group is gone or altered.
        RoundPlanError: ``combine`` was not given though the mode combines.
    """
    if finished.round.index != job.rounds - 1:
        return None
    if Turn.objects.filter(
        round_id=finished.round_id, status__in=(Turn.Status.PENDING, Turn.Status.RUNNING)
    ).exists():
        return None  # a sibling still runs: the last to end combines
    if get_mode(job.mode).secure_aggregation:
        return None  # made once the last aggregation is done (job_result_combine)
    result = job_result(job=job)
    if result.kind != StartFrom.AGGREGATE:
        return None
    if combine is None:
        raise RoundPlanError(
            f"job {job.pk}'s mode combines its last group into the result, but the "
            "turn was completed without a way to combine server states"
        )
    return _record_result(job=job, result=result, by=finished, combine=combine)


def job_result_combine(
    *, job: Job, combine: Callable[[list[bytes], list[int] | None], bytes]
) -> ServerCheckpoint | None:
    """The job's combined server result, made and recorded as ``Job.server_checkpoint``
    once its last secure aggregation is done: ``combine`` of the server ends of the
    aggregation's participants' turns, with their weights; ``None`` when its mode's result
    is not a combination.

    Raises:
        StoreError: a checkpoint of the last group is gone or altered.
    """
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        result = job_result(job=locked)
        if result.kind != StartFrom.AGGREGATE or not result.sources:
            return None
        weights = result.weights
        row = _record_result(
            job=locked,
            result=result,
            by=result.sources[-1],
            combine=lambda blobs: combine(blobs, weights),
        )
        Job.objects.filter(pk=locked.pk).update(server_checkpoint=row)
    return row


def _record_result(
    *, job: Job, result, by: Turn, combine: Callable[[list[bytes]], bytes]
) -> ServerCheckpoint:
    """Combine the server ends of ``result``'s sources and record it at the place one
    round past the last."""
    ends = [
        checkpoints_of_place(job_id=job.pk, round_index=t.round.index, position=t.position).last()
        for t in result.sources
    ]
    missing = [t.hospital.slug for t, row in zip(result.sources, ends, strict=True) if not row]
    if missing:
        raise StoreError(
            f"the server checkpoints of the last group (the ends of the turns of "
            f"{', '.join(missing)}) are gone; the job's result cannot be made"
        )
    blobs = [read_verified(checkpoint_dir() / row.path, row.sha256) for row in ends]
    return _record_round_start(turn=by, round_index=job.rounds, data=combine(blobs))


def _record_round_start(*, turn: Turn, round_index: int, data: bytes) -> ServerCheckpoint:
    """``data`` as the server state round ``round_index`` of ``turn``'s job starts from
    (position 0, step 0; one past the last round: the job's result), written by ``turn``."""
    path = checkpoint_path(job_id=turn.job_id, round_index=round_index, position=0, step=0)
    digest = write_atomic(checkpoint_dir() / path, data)
    row, _ = ServerCheckpoint.objects.update_or_create(
        job_id=turn.job_id,
        round_index=round_index,
        position=0,
        step=0,
        defaults={
            "turn": turn,
            "path": path,
            "sha256": digest,
            "size_bytes": len(data),
            "created_at": timezone.now(),
        },
    )
    return row


def shared_start(*, job: Job, round_index: int) -> ServerCheckpoint | None:
    """Where the shared server segment of ``round_index`` starts (SFLV2): the end of the
    round before, as :func:`shared_end_record` recorded it; ``None`` for the first round.

    Raises:
        StoreError: a later round's start is not recorded.
    """
    if round_index == 0:
        return None
    row = ServerCheckpoint.objects.filter(
        job=job, round_index=round_index, position=0, step=0
    ).first()
    if row is None:
        raise StoreError(
            f"the shared server segment's state at the start of round {round_index} of job "
            f"{job.pk} is gone; the round cannot start"
        )
    return row


def shared_end_record(*, turn: Turn, round_index: int, data: bytes) -> ServerCheckpoint:
    """The shared server segment after every training step of ``round_index`` (SFLV2): the
    job's server state, at the place the next round starts from (round + 1, position 0,
    step 0; after the last round, the job's result)."""
    with transaction.atomic():
        row = _record_round_start(turn=turn, round_index=round_index + 1, data=data)
        Job.objects.filter(pk=turn.job_id).update(server_checkpoint=row)
    return row


def _places_still_needed(finished: Turn) -> set[tuple[int, int]]:
    """The (round, position) places whose server checkpoints outlive ``finished``'s
    completion: turns of a parallel group still running, the ends of ``finished``'s own
    group (the next group may start from their combination), and whatever the open turns
    of the round start from. A round-robin turn needs none of them: its successor starts
    from the job's server checkpoint alone."""
    round_index = finished.round.index
    turns = list(
        Turn.objects.filter(job_id=finished.job_id, round__index__gte=round_index - 1)
        .exclude(pk=finished.pk)
        .select_related("round", "job")
    )
    places = {
        (t.round.index, t.position)
        for t in turns
        if t.status == Turn.Status.RUNNING
        or (
            t.status == Turn.Status.COMPLETED
            and (t.round.index, t.group) == (round_index, finished.group)
        )
    }
    completed = [t for t in turns if t.status == Turn.Status.COMPLETED] + [finished]
    for t in turns:
        if t.status in (Turn.Status.PENDING, Turn.Status.RUNNING):
            start = turn_start(turn=t, completed=completed)
            places.update((s.round.index, s.position) for s in start.sources)
    # Its own place keeps only its latest checkpoint (the job's), as in round-robin.
    places.discard((round_index, finished.position))
    return places


def _delete_checkpoints(rows: QuerySet) -> None:
    paths = [checkpoint_dir() / p for p in rows.values_list("path", flat=True)]
    rows.delete()

    def unlink() -> None:
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:  # a file left behind wastes space, nothing more
                logger.warning("could not delete checkpoint file %s: %s", path, e)

    transaction.on_commit(unlink)
