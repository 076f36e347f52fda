"""What the scheduler decides: which job to advance, which turns need a worker.

The Celery tasks in ``workers/`` call these and send the follow-up tasks; every state
change itself goes through :mod:`training.services` (and so into the audit log).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from kernel.actors import Actor
from medsplit.errors import UnknownModeError
from training.models import Job, Turn
from training.services import group_start_next, job_start, job_transition
from training.states import JobState


def job_advance_group(*, job_id: int) -> list[Turn]:
    """Start a scheduled job and its first group, or move a running job on.

    Returns:
        The running turns of the job's current group that no worker holds (the caller
        sends each to one); empty when there is nothing to run (paused, finished, or
        workers are on every turn).
    """
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return []
    try:
        if job.state == JobState.SCHEDULED:
            job = job_start(job=job)
        if job.state != JobState.RUNNING:
            return []
        running = group_start_next(job=job)
    except UnknownModeError as e:
        _fail_for_its_mode(job, e)
        return []
    now = timezone.now()
    return [turn for turn in running if not _held(turn, now)]


def _fail_for_its_mode(job: Job, error: UnknownModeError) -> None:
    """A job whose mode left the coordinator's configuration since it was created cannot
    be planned: it fails saying why, rather than being retried by every sweep."""
    job.refresh_from_db()
    if job.state == JobState.SCHEDULED:  # no round was made: start it bare, to fail it
        job = job_transition(
            job=job, to=JobState.RUNNING, actor=Actor.system(), reason="started by the scheduler"
        )
    if job.state == JobState.RUNNING:
        job_transition(job=job, to=JobState.FAILED, actor=Actor.system(), reason=str(error))


def job_advance(*, job_id: int) -> Turn | None:
    """The first turn of :func:`job_advance_group`, or ``None``: for a round-robin job
    (one turn per group) the one turn to send to a worker."""
    turns = job_advance_group(job_id=job_id)
    return turns[0] if turns else None


def turn_dispatched(*, turn_id: int, delay: float = 0.0) -> None:
    """Note that a runner task was sent for the turn, to start in ``delay`` seconds (the
    sweep waits a lease past that before sending another, in case the first is only
    queued behind other work)."""
    Turn.objects.filter(pk=turn_id).update(dispatched_at=timezone.now() + timedelta(seconds=delay))


def turns_without_runner(*, now: datetime | None = None) -> list[int]:
    """Running turns of running jobs that no live runner holds and that were not sent
    to a worker within the last lease period."""
    now = now or timezone.now()
    grace = now - timedelta(seconds=settings.MEDSPLIT["TURN_LEASE_SECONDS"])
    return list(
        Turn.objects.filter(status=Turn.Status.RUNNING, job__state=JobState.RUNNING)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .filter(Q(dispatched_at__isnull=True) | Q(dispatched_at__lte=grace))
        .values_list("pk", flat=True)
    )


def jobs_to_advance(*, now: datetime | None = None) -> list[int]:
    """Scheduled jobs, and running jobs with no running turn (a lost follow-up task).

    A job whose turn ended less than a sweep period ago is left to the follow-up its
    runner sent: a sweep queued behind a turn (on a worker busy with it) runs just before
    that follow-up, and sending another would only put a duplicate ``advance_job`` and
    ``run_turn`` into every hand-over (20-50 ms on the benchmark's machine). A follow-up
    really lost is found by the next sweep.
    """
    now = now or timezone.now()
    running_turn = Turn.objects.filter(status=Turn.Status.RUNNING)
    just_ended = Turn.objects.filter(
        finished_at__gt=now - timedelta(seconds=settings.MEDSPLIT["SWEEP_SECONDS"])
    )
    waiting = (
        Q(state=JobState.RUNNING)
        & ~Q(pk__in=running_turn.values("job_id"))
        & ~Q(pk__in=just_ended.values("job_id"))
    )
    return list(
        Job.objects.filter(Q(state=JobState.SCHEDULED) | waiting).values_list("pk", flat=True)
    )


def _held(turn: Turn, now: datetime) -> bool:
    return bool(turn.runner) and turn.lease_expires_at is not None and turn.lease_expires_at > now
