"""What the scheduler decides: which job to advance, which turn needs a worker.

The Celery tasks in ``workers/`` call these and send the follow-up tasks; every state
change itself goes through :mod:`training.services` (and so into the audit log).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from training.models import Job, Turn
from training.services import job_start, turn_start_next
from training.states import JobState


def job_advance(*, job_id: int) -> Turn | None:
    """Start a scheduled job and its next turn, or move a running job on.

    Returns:
        The job's running turn when no worker holds it (the caller sends it to one),
        else ``None`` (nothing to run: paused, finished, or a worker is on it).
    """
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    if job.state == JobState.SCHEDULED:
        job = job_start(job=job)
    if job.state != JobState.RUNNING:
        return None
    turn = turn_start_next(job=job)
    if turn is None or _held(turn, timezone.now()):
        return None
    return turn


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


def jobs_to_advance() -> list[int]:
    """Scheduled jobs, and running jobs with no running turn (a lost follow-up task)."""
    running_turn = Turn.objects.filter(status=Turn.Status.RUNNING)
    return list(
        Job.objects.filter(
            Q(state=JobState.SCHEDULED)
            | (Q(state=JobState.RUNNING) & ~Q(pk__in=running_turn.values("job_id")))
        ).values_list("pk", flat=True)
    )


def _held(turn: Turn, now: datetime) -> bool:
    return bool(turn.runner) and turn.lease_expires_at is not None and turn.lease_expires_at > now
