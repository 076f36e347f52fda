"""Writes of the training app: creating jobs, moving them through their states, and the
runtime services the scheduler calls turn by turn.

Every function here runs inside ``transaction.atomic`` and writes the audit log in the
same transaction. Runtime services lock the job's row first (``select_for_update``) and
then the turn's, always in that order, so two scheduler tasks working on one job run one
after the other and cannot deadlock. They act as :meth:`Actor.system`.

Idempotency, for tasks that may run twice:

* ``job_start`` on a job already running is a no-op.
* ``group_start_next`` returns the group already running, if nothing of it is pending.
* ``turn_record_progress`` takes cumulative counters, so a repeat changes nothing; a
  report older than the turn's counters is ignored.
* ``turn_finish`` on a completed turn and ``turn_fail`` on a failed or skipped turn are
  no-ops that return the turn unchanged (no second retry is ever created).
* ``handoff_record`` again with the same ciphertext hash returns the first record.

Anything else out of order (finishing a failed turn, failing a completed one, a job
transition not in the table) is a :class:`~kernel.errors.Conflict`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from hospitals.models import Hospital
from kernel.actors import Actor, ActorKind
from kernel.errors import Conflict, InvalidInput, PermissionDenied
from kernel.permissions import require_consortium_admin
from medsplit.modes import require_mode
from training.dispatch import job_changed_on_commit
from training.evaluation import evaluation_on_completion
from training.models import (
    Aggregation,
    HandOff,
    Job,
    JobParticipant,
    MetricPoint,
    OnFailure,
    Round,
    Turn,
)
from training.states import TERMINAL, JobState, Who, allowed
from training.validation import job_spec_validate

#: Where the coordinator's configuration adds modes, for the message of an unknown one.
EXTRA_MODES_SETTING = 'MEDSPLIT["EXTRA_MODES"] (MEDSPLIT_EXTRA_MODES)'

_VERBS = {
    JobState.DRAFT: "return a job to draft",
    JobState.SCHEDULED: "schedule a job",
    JobState.RUNNING: "start or resume a job",
    JobState.PAUSED: "pause a job",
    JobState.COMPLETED: "complete a job",
    JobState.FAILED: "fail a job",
    JobState.CANCELLED: "cancel a job",
}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_REASON = 2000
_MAX_METRICS = 64


# -- jobs -------------------------------------------------------------------------------


def job_create(*, actor: Actor, data: Mapping[str, Any]) -> Job:
    """Validate a job's configuration and store it as a draft.

    Args:
        actor: a consortium admin.
        data: the configuration (see :class:`training.validation.JobInput`).

    Raises:
        PermissionDenied: the actor is not a consortium admin.
        InvalidInput: the configuration is wrong; ``details`` names every field.
    """
    require_consortium_admin(actor, "create a job")
    spec = job_spec_validate(data=data)  # before the transaction: it may take a second
    with transaction.atomic():
        now = timezone.now()
        described = spec.description
        job = Job.objects.create(
            name=spec.name,
            description=described.to_json(),
            model_name=described.model,
            mode=described.mode,
            rounds=described.rounds,
            on_failure=spec.on_failure,
            max_retries=spec.max_retries,
            round_deadline_seconds=spec.round_deadline_seconds,
            state=JobState.DRAFT,
            state_changed_at=now,
            created_by=actor.user if actor.kind == ActorKind.PERSON else None,
        )
        JobParticipant.objects.bulk_create(
            JobParticipant(job=job, hospital=hospital, position=position, feature_set=features)
            for position, (hospital, features) in enumerate(spec.participants)
        )
        _audit(
            actor,
            "job.created",
            job,
            details={
                "model": described.model,
                # Naming a factory runs its code on every party: who asked with what.
                **({"model_args": dict(described.model_args)} if described.model_args else {}),
                "mode": described.mode,
                "cuts": list(described.cuts),
                "rounds": described.rounds,
                "participants": [h.slug for h, _ in spec.participants],
            },
        )
    return job


def job_transition(
    *,
    job: Job,
    to: JobState | str,
    actor: Actor,
    reason: str = "",
    reason_of: Hospital | None = None,
    shared_reason: str = "",
) -> Job:
    """Move ``job`` to state ``to``: the only code that changes a job's state.

    The pair (current, ``to``) must be in :data:`training.states.TRANSITIONS`, and the
    actor must be allowed to ask for it. Entering a final state closes what is still
    open: a running turn fails, pending turns are skipped, the open round ends.

    Args:
        job: the job (its state is re-read under a row lock).
        to: the requested state.
        actor: a consortium admin, or the system for the scheduler's transitions.
        reason: why, for the job's history and the audit log.
        reason_of: the hospital whose failure ``reason`` tells, if it does: the other
            participants see ``shared_reason`` instead (kernel.permissions: least
            privilege).
        shared_reason: what the other participants see instead of ``reason``.

    Returns:
        The job as stored after the transition.

    Raises:
        PermissionDenied: the actor may not ask for this transition.
        Conflict: the transition is not allowed from the job's current state (the
            message names both states), or a participant left the consortium.
    """
    try:
        requested = JobState(to)
    except ValueError:
        raise InvalidInput(
            f"no job state {to!r}", details={"state": [f"no state {to!r}"]}
        ) from None
    if not (actor.is_system or actor.is_consortium_admin):
        raise PermissionDenied(f"only a consortium admin may {_VERBS[requested]}")
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        current = JobState(locked.state)
        who = allowed(current, requested)
        if who is None:
            raise Conflict(
                f"job {locked.pk} is {current.value}; it cannot become {requested.value}",
                details={"state": current.value, "requested": requested.value},
            )
        if who == Who.SYSTEM and not actor.is_system:
            raise PermissionDenied(
                f"only the scheduler may move a job from {current.value} to {requested.value}"
            )
        if requested == JobState.SCHEDULED:
            _require_participants_enrolled(locked)
        now = timezone.now()
        closed: dict[str, int] = {}
        if requested in TERMINAL:
            locked.finished_at = now
            closed = _close_open_work(locked, requested, now)
        if requested == JobState.RUNNING and locked.started_at is None:
            locked.started_at = now
        locked.state = requested
        locked.state_reason = reason[:_MAX_REASON]
        locked.state_reason_hospital = reason_of
        locked.state_reason_shared = shared_reason[:_MAX_REASON] if reason_of else ""
        locked.state_changed_at = now
        locked.save(
            update_fields=[
                "state",
                "state_reason",
                "state_reason_hospital",
                "state_reason_shared",
                "state_changed_at",
                "started_at",
                "finished_at",
            ]
        )
        _audit(
            actor,
            f"job.{requested.value}",
            locked,
            details={"from": current.value, "to": requested.value, "reason": reason, **closed},
        )
        if requested == JobState.SCHEDULED or (current, requested) == (
            JobState.PAUSED,
            JobState.RUNNING,
        ):
            job_changed_on_commit(locked.pk)
    return locked


def _require_participants_enrolled(job: Job) -> None:
    """A job is scheduled only while all its hospitals are still enrolled."""
    for participant in job.participants.select_related("hospital"):
        hospital = participant.hospital
        if hospital.status != Hospital.Status.ENROLLED:
            raise Conflict(
                f"hospital {hospital.slug!r} is {hospital.status}, not enrolled; "
                "the job cannot be scheduled",
                details={"participants": [hospital.slug]},
            )


def _close_open_work(job: Job, state: JobState, now: datetime) -> dict[str, int]:
    """End the open round and turns of a job entering a final state."""
    why = f"job {state.value}"
    failed = job.turns.filter(status=Turn.Status.RUNNING).update(
        status=Turn.Status.FAILED, failure_reason=why, finished_at=now
    )
    skipped = job.turns.filter(status=Turn.Status.PENDING).update(
        status=Turn.Status.SKIPPED, failure_reason=why, finished_at=now
    )
    round_status = {
        JobState.COMPLETED: Round.Status.COMPLETED,
        JobState.FAILED: Round.Status.FAILED,
        JobState.CANCELLED: Round.Status.CANCELLED,
    }[state]
    job.round_set.filter(status=Round.Status.RUNNING).update(status=round_status, finished_at=now)
    return {"turns_failed": failed, "turns_skipped": skipped}


# -- the runtime: called by the scheduler as the system ---------------------------------


def job_start(*, job: Job) -> Job:
    """Start a scheduled job: scheduled → running, with round 0 and its turns created in
    the groups of the mode's plan (all pending; :func:`group_start_next` starts the first).

    Idempotent: a job already running is returned as it is.

    Raises:
        Conflict: the job is neither scheduled nor running (a paused job is resumed by
            an admin, not started again).
    """
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state == JobState.RUNNING:
            return locked
        if locked.state != JobState.SCHEDULED:  # a paused job is resumed, not started
            raise Conflict(
                f"job {locked.pk} is {locked.state}; only a scheduled job can start",
                details={"state": locked.state, "requested": JobState.RUNNING.value},
            )
        # Rows first, audit (in job_transition) last: see audit_record on lock order.
        _round_create(job=locked, index=0)
        locked = job_transition(
            job=locked, to=JobState.RUNNING, actor=_system(), reason="started by the scheduler"
        )
    return locked


def group_start_next(*, job: Job) -> list[Turn]:
    """Start the turns of the job's current group, moving to the next group, the next
    round or completing the job as needed.

    The current group is the round's lowest one with a pending or running turn (the
    job mode's :meth:`~medsplit.modes.SplitMode.plan_round` made the groups): every
    pending turn of it starts, a retry too while the rest of its group runs; the next
    group starts only once every turn of this one ended (completed, skipped, or failed
    for good).

    Returns:
        The group's running turns, in position order (those started now and those
        running already); empty when the job is not running (paused, finished) or has
        just completed its last round.

    Idempotent: while the group runs with nothing pending, it is returned as it is.
    """
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state != JobState.RUNNING:
            return []
        round_ = locked.round_set.filter(index=locked.current_round or 0).first()
        if round_ is None:  # started by a bare transition: begin at round 0
            round_ = _round_create(job=locked, index=0)
        secure = require_mode(locked.mode, setting=EXTRA_MODES_SETTING).secure_aggregation
        while True:
            open_turns = round_.turns.filter(status__in=(Turn.Status.PENDING, Turn.Status.RUNNING))
            group = open_turns.order_by("group").values_list("group", flat=True).first()
            if secure and not _groups_aggregated(locked, round_, before=group):
                return []  # the aggregation of a group that ended is still under way
            if group is not None:
                pending = (
                    open_turns.filter(group=group, status=Turn.Status.PENDING)
                    .select_related("hospital")
                    .order_by("position", "attempt")
                )
                for turn in pending:
                    _turn_start(job=locked, turn=turn)
                return list(
                    round_.turns.filter(group=group, status=Turn.Status.RUNNING)
                    .select_related("hospital")
                    .order_by("position", "attempt")
                )
            round_.status = Round.Status.COMPLETED
            round_.finished_at = timezone.now()
            round_.save(update_fields=["status", "finished_at"])
            if round_.index + 1 >= locked.rounds:
                job_transition(
                    job=locked,
                    to=JobState.COMPLETED,
                    actor=_system(),
                    reason=f"all {locked.rounds} round(s) done",
                )
                # Its final model, scored at every hospital with a test set.
                evaluation_on_completion(job=locked)
                return []
            round_ = _round_create(job=locked, index=round_.index + 1)


def _groups_aggregated(job: Job, round_: Round, *, before: int | None) -> bool:
    """Whether every group of ``round_`` that ended (below ``before``; all when ``None``)
    has its secure aggregation done; opens the first attempt of one that has none yet.

    A group none of whose turns completed leaves nothing to average: the job fails.
    """
    groups = sorted(set(round_.turns.values_list("group", flat=True)))
    for group in (g for g in groups if before is None or g < before):
        latest = (
            Aggregation.objects.filter(job=job, round_index=round_.index, group=group)
            .order_by("-attempt")
            .first()
        )
        if latest is not None and latest.status == Aggregation.Status.DONE:
            continue
        if latest is None:
            completed = list(
                round_.turns.filter(group=group, status=Turn.Status.COMPLETED)
                .select_related("hospital")
                .order_by("position")
            )
            if completed:
                aggregation_open(job=job, round_=round_, group=group, turns=completed)
            else:
                job_transition(
                    job=job,
                    to=JobState.FAILED,
                    actor=_system(),
                    reason=f"no hospital completed its turn of round {round_.index}: there is "
                    "nothing to average",
                )
        return False
    return True


def aggregation_open(
    *, job: Job, round_: Round, group: int, turns: list[Turn]
) -> Aggregation | None:
    """Open the first attempt of a group's secure aggregation, with the hospitals whose
    turns completed and their public weights (the training samples each reported).

    A hospital that reported no training split size fails the job (no weight, no
    average): then ``None``.
    """
    weights: dict[str, int] = {}
    for turn in turns:
        sizes = (turn.hospital.dataset_summary or {}).get("split_sizes") or {}
        train = sizes.get("train") if isinstance(sizes, dict) else None
        if not isinstance(train, int) or isinstance(train, bool) or train < 1:
            job_transition(
                job=job,
                to=JobState.FAILED,
                actor=_system(),
                reason=f"{turn.hospital.slug} reported no training split size (its heartbeat's "
                "split_sizes), which weighs its segments in the average",
            )
            return None
        weights[turn.hospital.slug] = train
    now = timezone.now()
    aggregation = Aggregation.objects.create(
        job=job,
        round_index=round_.index,
        group=group,
        attempt=0,
        weights=weights,
        created_at=now,
        deadline_at=now + timedelta(seconds=job.round_deadline_seconds),
    )
    _audit(
        _system(),
        "aggregation.opened",
        job,
        details={
            "round": round_.index,
            "group": group,
            "attempt": 0,
            "weights": weights,
            "deadline_s": job.round_deadline_seconds,
        },
    )
    return aggregation


def turn_start_next(*, job: Job) -> Turn | None:
    """The first running turn of :func:`group_start_next`'s group, or ``None``: for a
    round-robin job (one turn per group) the one turn that runs."""
    running = group_start_next(job=job)
    return running[0] if running else None


def _round_create(*, job: Job, index: int) -> Round:
    round_ = Round.objects.create(
        job=job, index=index, status=Round.Status.RUNNING, started_at=timezone.now()
    )
    participants = list(job.participants.order_by("position"))
    groups = require_mode(job.mode, setting=EXTRA_MODES_SETTING).plan_round(participants)
    Turn.objects.bulk_create(
        Turn(job=job, round=round_, hospital_id=p.hospital_id, position=p.position, group=g)
        for g, members in enumerate(groups)
        for p in members
    )
    Job.objects.filter(pk=job.pk).update(current_round=index)
    job.current_round = index
    return round_


def _turn_start(*, job: Job, turn: Turn) -> Turn:
    turn.status = Turn.Status.RUNNING
    turn.started_at = timezone.now()
    turn.save(update_fields=["status", "started_at"])
    Job.objects.filter(pk=job.pk).update(current_turn=turn)
    job.current_turn = turn
    _audit(
        _system(),
        "turn.started",
        job,
        turn=turn,
        details={"round": job.current_round, "position": turn.position, "attempt": turn.attempt},
    )
    return turn


def turn_record_progress(
    *,
    turn: Turn,
    steps: int,
    samples: int,
    bytes_up: int,
    bytes_down: int,
    loss: float | None,
    final: bool = False,
    at: datetime | None = None,
) -> MetricPoint | None:
    """Record a running turn's progress; keep a metric point at a bounded rate.

    The counters are cumulative over the turn (not increments) and always update the
    turn. A :class:`MetricPoint` is stored only when at least
    ``MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]`` passed since the turn's last stored
    point, or when this is the final step (``final``, or ``steps`` reaching the job's
    ``max_steps_per_turn``), and never twice for one step.

    Args:
        turn: a running turn.
        steps, samples, bytes_up, bytes_down: totals of the turn so far.
        loss: the last training loss; a non-finite loss is stored as ``None``.
        final: this is the turn's last step.
        at: when the progress was measured (default: now).

    Returns:
        The stored point, or ``None`` when none was due (or the report was stale).

    Raises:
        InvalidInput: a counter is not a non-negative integer.
        Conflict: the turn is not running.
    """
    counters = {"steps": steps, "samples": samples, "bytes_up": bytes_up, "bytes_down": bytes_down}
    bad = {
        name: ["must be an integer >= 0"]
        for name, value in counters.items()
        if not isinstance(value, int) or isinstance(value, bool) or value < 0
    }
    if bad:
        raise InvalidInput("progress counters must be integers >= 0", details=bad)
    at = at or timezone.now()
    loss_value = float(loss) if loss is not None and math.isfinite(loss) else None
    with transaction.atomic():
        locked = Turn.objects.select_for_update().select_related("job").get(pk=turn.pk)
        if locked.status != Turn.Status.RUNNING:
            raise Conflict(
                f"turn {locked.pk} is {locked.status}; progress is recorded only while it runs",
                details={"status": locked.status},
            )
        if steps < locked.steps:
            return None  # an older report arriving late: the turn already knows more
        for name, value in counters.items():
            setattr(locked, name, max(getattr(locked, name), value))
        # No loss at all (``None``): the worker does not compute it (the labels are at the
        # hospital) and the last one the hospital reported stays (turn_record_hospital_loss).
        if loss is not None:
            locked.last_loss = loss_value
        locked.save(update_fields=[*counters, "last_loss"])
        cap = locked.job.job_description().max_steps_per_turn
        is_final = final or (cap is not None and steps >= cap)
        return _metric_point_maybe(turn=locked, at=at, final=is_final)


def turn_record_hospital_loss(*, turn: Turn, step: int, loss: float) -> Turn:
    """Keep the training loss a hospital reported for step ``step`` of its running turn,
    in a mode whose loss is computed at the hospital (the worker has none to report).

    It becomes the turn's ``last_loss``, which the next metric point the worker's progress
    stores carries: so a point's loss is the one its hospital last reported, at most about
    a second older than the point. The agent sends its reports one after another, from one
    thread, so they arrive in step order.

    A point the worker stored at this very step before the report arrived (the turn's last
    step, above all: the agent reports it at once, but a short turn may be completed by
    then) takes the loss too, so that every turn's curve ends on its own last loss. A
    completed turn takes nothing else.

    Raises:
        Conflict: the turn is not running, and no point of it at ``step`` waits for a loss.
    """
    value = float(loss) if math.isfinite(loss) else None
    with transaction.atomic():
        locked = Turn.objects.select_for_update().get(pk=turn.pk)
        waiting = locked.metric_points.filter(step=step, loss__isnull=True)
        late = locked.status == Turn.Status.COMPLETED and waiting.exists()
        if locked.status != Turn.Status.RUNNING and not late:
            raise Conflict(
                f"turn {locked.pk} is {locked.status}; its loss is taken only while it runs",
                details={"status": locked.status},
            )
        if value is not None:
            waiting.update(loss=value)
        if locked.status == Turn.Status.RUNNING or step >= locked.steps:
            locked.last_loss = value
            locked.save(update_fields=["last_loss"])
    return locked


def _metric_point_maybe(*, turn: Turn, at: datetime, final: bool) -> MetricPoint | None:
    """Store the turn's current counters as a point, if one is due."""
    last = turn.metric_points.order_by("-step").values("step", "time").first()
    if last is not None:
        if turn.steps <= last["step"]:
            return None
        interval = settings.MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]
        if not final and (at - last["time"]).total_seconds() < interval:
            return None
    return MetricPoint.objects.create(
        job_id=turn.job_id,
        turn=turn,
        step=turn.steps,
        time=at,
        loss=turn.last_loss,
        samples=turn.samples,
        bytes_up=turn.bytes_up,
        bytes_down=turn.bytes_down,
    )


def turn_finish(
    *, turn: Turn, metrics: Mapping[str, float], crossed: Mapping[str, Any] | None = None
) -> Turn:
    """Mark a running turn completed with its validation metrics.

    The turn's last progress is stored as a final metric point if the rate bound had
    held it back. The next group is started by :func:`group_start_next`, not here.

    ``crossed`` (names and dtypes of the tensors that crossed, by direction and frame
    kind; never values) goes into the audit log with the turn's counters.

    Idempotent: finishing a completed turn returns it unchanged (its first metrics kept).

    Raises:
        InvalidInput: ``metrics`` is not a small map of names to finite numbers.
        Conflict: the turn is pending, failed or skipped.
    """
    clean = _clean_metrics(metrics)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=turn.job_id)
        locked = Turn.objects.select_for_update().select_related("hospital").get(pk=turn.pk)
        if locked.status == Turn.Status.COMPLETED:
            return locked
        if locked.status != Turn.Status.RUNNING:
            raise Conflict(
                f"turn {locked.pk} is {locked.status}; only a running turn can finish",
                details={"status": locked.status},
            )
        now = timezone.now()
        if locked.steps > 0:
            _metric_point_maybe(turn=locked, at=now, final=True)
        locked.status = Turn.Status.COMPLETED
        locked.finished_at = now
        locked.metrics = clean
        locked.save(update_fields=["status", "finished_at", "metrics"])
        _audit(
            _system(),
            "turn.finished",
            job,
            turn=locked,
            details={
                "steps": locked.steps,
                "samples": locked.samples,
                "bytes_up": locked.bytes_up,
                "bytes_down": locked.bytes_down,
                "metrics": clean,
                **({"crossed": dict(crossed)} if crossed else {}),
            },
        )
    return locked


def _clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(metrics, Mapping) or len(metrics) > _MAX_METRICS:
        raise InvalidInput(
            "metrics must be a map of names to numbers",
            details={"metrics": [f"give at most {_MAX_METRICS} name: number pairs"]},
        )
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        ok_name = isinstance(name, str) and 0 < len(name) <= 64
        ok_value = isinstance(value, int | float) and not isinstance(value, bool)
        if not (ok_name and ok_value and math.isfinite(value)):
            raise InvalidInput(
                "metrics must be a map of names to finite numbers",
                details={"metrics": [f"{name!r}: {value!r} is not a name and a finite number"]},
            )
        clean[name] = float(value)
    return clean


def turn_fail(*, turn: Turn, reason: str) -> Turn:
    """Mark a running turn failed and apply the job's on-failure policy.

    * ``retry``: a new attempt of the same turn is queued (pending) while the turn has
      been tried at most ``max_retries`` times; after that the job fails.
    * ``skip``: the turn is marked skipped (its reason kept) and the job goes on.
    * ``fail``: the job fails.

    Idempotent: failing a turn already failed or skipped returns it unchanged.

    Raises:
        Conflict: the turn is pending or completed.
    """
    reason = (str(reason) or "no reason given")[:_MAX_REASON]
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=turn.job_id)
        locked = Turn.objects.select_for_update().select_related("hospital").get(pk=turn.pk)
        if locked.status in (Turn.Status.FAILED, Turn.Status.SKIPPED):
            return locked
        if locked.status != Turn.Status.RUNNING:
            raise Conflict(
                f"turn {locked.pk} is {locked.status}; only a running turn can fail",
                details={"status": locked.status},
            )
        locked.finished_at = timezone.now()
        locked.failure_reason = reason
        retry: Turn | None = None
        if job.on_failure == OnFailure.SKIP:
            locked.status = Turn.Status.SKIPPED
            outcome = "skipped"
        else:
            locked.status = Turn.Status.FAILED
            if job.on_failure == OnFailure.RETRY and locked.attempt <= job.max_retries:
                outcome = "retry"
            else:
                outcome = "job failed"
        locked.save(update_fields=["status", "finished_at", "failure_reason"])
        if outcome == "retry":
            retry = Turn.objects.create(
                job=job,
                round_id=locked.round_id,
                hospital_id=locked.hospital_id,
                position=locked.position,
                group=locked.group,  # it runs where its turn's plan put it
                attempt=locked.attempt + 1,
            )
        if outcome == "job failed" and job.state in (JobState.RUNNING, JobState.PAUSED):
            tries = f" after {locked.attempt} attempts" if job.on_failure == OnFailure.RETRY else ""
            what = f"turn {locked.pk} of {locked.hospital.slug} failed{tries}"
            job_transition(
                job=job,
                to=JobState.FAILED,
                actor=_system(),
                reason=f"{what}: {reason}",
                # Its reason is that hospital's; the other participants see which turn.
                reason_of=locked.hospital,
                shared_reason=f"{what} (its reason is shown to {locked.hospital.slug} and "
                "the consortium's admins)",
            )
        # Audited after job_transition's row updates: audit_record is called last.
        _audit(
            _system(),
            "turn.failed",
            job,
            turn=locked,
            details={
                "reason": reason,
                "attempt": locked.attempt,
                "policy": job.on_failure,
                "outcome": outcome,
                "retry_turn": retry.pk if retry else None,
                "bytes_up": locked.bytes_up,
                "bytes_down": locked.bytes_down,
            },
        )
    return locked


@dataclass(frozen=True)
class SealedFor:
    """One blob a hospital sealed after its turn: for whom, its SHA-256 and size."""

    recipient: Hospital
    ciphertext_sha256: str
    size_bytes: int


def handoff_record(
    *, turn: Turn, sender: Hospital, recipient: Hospital, ciphertext_sha256: str, size_bytes: int
) -> HandOff:
    """Record that ``sender`` handed its front's weights to ``recipient`` after ``turn``
    (:func:`handoffs_record` with one blob)."""
    return handoffs_record(
        turn=turn,
        sender=sender,
        sealed=[SealedFor(recipient, ciphertext_sha256, size_bytes)],
    )[0]


def handoffs_record(*, turn: Turn, sender: Hospital, sealed: Sequence[SealedFor]) -> list[HandOff]:
    """Record that ``sender`` handed its front's weights after ``turn`` to each recipient
    of ``sealed``, all or none, in one transaction (an agent seals for every other
    participant after its turn: one request, not n - 1).

    Only metadata is stored: each ciphertext's size and SHA-256. The ciphertexts
    themselves (weights encrypted for each recipient's key) travel through the relay and
    are never stored by the coordinator, in clear or otherwise.

    Idempotent: a record made before, the same again, is returned as it was.

    Raises:
        InvalidInput: no blob, bad hash or size, the sender did not take the turn, a
            recipient named twice, or one that is not another participant of the job
            (the details name each; nothing is recorded).
        Conflict: the turn is not running or completed, or it was already handed off to
            a recipient with a different ciphertext (nothing is recorded).
    """
    bad: dict[str, list[str]] = {}
    if not sealed:
        bad["handoffs"] = ["name at least one recipient"]
    if sender.pk != turn.hospital_id:
        bad["sender"] = [f"turn {turn.pk} was not taken by {sender.slug!r}"]
    members = set(
        JobParticipant.objects.filter(job_id=turn.job_id).values_list("hospital_id", flat=True)
    )
    seen: set[int] = set()
    for blob in sealed:
        slug = blob.recipient.slug
        if not isinstance(blob.ciphertext_sha256, str) or not _SHA256.fullmatch(
            blob.ciphertext_sha256
        ):
            bad.setdefault("ciphertext_sha256", []).append(
                f"for {slug!r}: must be 64 lower-case hexadecimal digits"
            )
        size = blob.size_bytes
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            bad.setdefault("size_bytes", []).append(f"for {slug!r}: must be an integer >= 1")
        if blob.recipient.pk == sender.pk:
            bad.setdefault("recipient", []).append("a hospital does not hand off to itself")
        elif blob.recipient.pk not in members:
            bad.setdefault("recipient", []).append(
                f"{slug!r} does not take part in job {turn.job_id}"
            )
        elif blob.recipient.pk in seen:
            bad.setdefault("recipient", []).append(f"{slug!r} is named twice")
        seen.add(blob.recipient.pk)
    if bad:
        raise InvalidInput("the hand-off record is not valid", details=bad)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=turn.job_id)
        locked = Turn.objects.select_for_update().get(pk=turn.pk)
        existing = {
            h.recipient_id: h
            for h in HandOff.objects.filter(turn=locked, recipient_id__in=list(seen))
        }
        for blob in sealed:
            held = existing.get(blob.recipient.pk)
            if held is not None and (held.ciphertext_sha256, held.size_bytes) != (
                blob.ciphertext_sha256,
                blob.size_bytes,
            ):
                raise Conflict(
                    f"turn {locked.pk} was already handed off to {blob.recipient.slug!r} "
                    "with another ciphertext",
                    details={"ciphertext_sha256": held.ciphertext_sha256},
                )
        if len(existing) < len(sealed) and locked.status not in (
            Turn.Status.RUNNING,
            Turn.Status.COMPLETED,
        ):
            raise Conflict(
                f"turn {locked.pk} is {locked.status}; only a running or completed turn "
                "hands off its weights",
                details={"status": locked.status},
            )
        recorded = []
        for blob in sealed:
            held = existing.get(blob.recipient.pk)
            if held is not None:
                recorded.append(held)
                continue
            recorded.append(
                HandOff.objects.create(
                    job=job,
                    turn=locked,
                    sender=sender,
                    recipient=blob.recipient,
                    ciphertext_sha256=blob.ciphertext_sha256,
                    size_bytes=blob.size_bytes,
                    created_at=timezone.now(),
                )
            )
            _audit(
                _system(),
                "handoff.recorded",
                job,
                hospital=sender.slug,
                details={
                    "turn": locked.pk,
                    "sender": sender.slug,
                    "recipient": blob.recipient.slug,
                    "size_bytes": blob.size_bytes,
                    "ciphertext_sha256": blob.ciphertext_sha256,
                },
            )
    return recorded


# -- helpers ----------------------------------------------------------------------------


def _system() -> Actor:
    return Actor.system()


def _audit(
    actor: Actor,
    action: str,
    job: Job,
    *,
    turn: Turn | None = None,
    hospital: str = "",
    details: Mapping[str, Any] | None = None,
) -> None:
    if turn is not None:
        target = f"turn:{turn.pk}"
        hospital = hospital or turn.hospital.slug
    else:
        target = f"job:{job.pk}"
    audit_record(
        actor=actor, action=action, target=target, hospital=hospital, job_id=job.pk, details=details
    )
