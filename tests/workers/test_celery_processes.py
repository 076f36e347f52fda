"""Surviving failures with real processes: Celery workers and beat as subprocesses, the
real Redis, the real database; the hospitals are played with the core client role.

* A worker killed with SIGKILL mid-turn: another worker takes the turn over from the
  last checkpoint, the job completes, and the weights equal unsplit training exactly.
* Redis restarted mid-job (keeping nothing): the job resumes from checkpoints once Redis
  is back, and still equals unsplit training; any turn that failed on the way failed
  with the relay's error, in the audit log.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from audit.models import AuditEvent
from kernel.actors import Actor
from medsplit.training.verify import deterministic
from tests.workers.hospitals import Hospitals, assert_exact, local_data, report_sizes
from tests.workers.processes import (
    Processes,
    RedisServer,
    processes,
    wait_until,
    workers_relay_user,
)
from training import services
from training.models import Job, Turn
from training.states import JobState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

__all__ = ["processes"]


def scheduled_job(make_job, admin_actor: Actor) -> Job:
    job = make_job(seed=uuid.uuid4().int % 1000, rounds=2, max_steps_per_turn=9, max_retries=3)
    # Before a worker can claim a turn: it checks the hospital's frames against these.
    report_sizes(job, local_data(job, 16 * 9), local_data(job, 16))
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)


def job_state(job: Job) -> str:
    job.refresh_from_db()
    return job.state if job.state in (JobState.COMPLETED, JobState.FAILED) else ""


def test_a_worker_killed_mid_turn_is_replaced_and_the_job_stays_exact(
    processes: Processes, redis_url: str, make_job, admin_actor: Actor
) -> None:
    """The workers and beat also run as the workers' own Redis user here, as deployed."""
    with workers_relay_user(redis_url, processes):
        run_and_kill_a_worker(processes, redis_url, make_job, admin_actor)


def run_and_kill_a_worker(processes: Processes, redis_url: str, make_job, admin_actor) -> None:
    workers = [processes.celery_worker("worker-1"), processes.celery_worker("worker-2")]
    processes.celery_beat()
    job = scheduled_job(make_job, admin_actor)
    train, val = local_data(job, 16 * 9), local_data(job, 16)
    with deterministic():
        hospitals = Hospitals(job, redis_url, train, val).start()

        def busy_turn() -> Turn | None:
            # The second hospital's first turn, four steps in: past one checkpoint.
            return (
                Turn.objects.filter(job=job, position=1, status="running", steps__gte=4)
                .exclude(runner="")
                .first()
            )

        turn = wait_until("a turn four steps in", busy_turn, 120, processes)
        pid = int(turn.runner.split(":")[1])
        assert pid in {w.pid for w in workers}, "the runner is one of this test's workers"
        os.kill(pid, signal.SIGKILL)

        state = wait_until("the job to end", lambda: job_state(job), 180, processes)
        assert state == JobState.COMPLETED, processes.logs()
        hospitals.join(60)
        assert_exact(hospitals)
    taken = AuditEvent.objects.filter(job_id=job.pk, action="turn.taken_over")
    assert taken.count() == 1
    assert taken.get().details["from"] == turn.runner
    turn.refresh_from_db()
    assert turn.status == Turn.Status.COMPLETED
    assert turn.runs == 2
    # Resumed from a checkpoint taken mid-turn (every 3 steps), not from the start.
    first, *again = hospitals.resumed_at[(0, 1)]
    assert first == 0 and len(again) == 1, hospitals.resumed_at
    assert again[0] > 0 and again[0] % 3 == 0, hospitals.resumed_at


def test_redis_restarted_mid_job_resumes_from_checkpoints(
    processes: Processes, tmp_path, settings, make_job, admin_actor: Actor, caplog
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        settings.MEDSPLIT = {**settings.MEDSPLIT, "WORKER_REDIS_URL": server.url}
        processes.env.update(REDIS_URL=server.url, CELERY_BROKER_URL=server.url)
        processes.celery_worker("worker-1")
        processes.celery_worker("worker-2")
        processes.celery_beat()
        job = scheduled_job(make_job, admin_actor)
        train, val = local_data(job, 16 * 9), local_data(job, 16)
        with deterministic():
            hospitals = Hospitals(job, server.url, train, val).start()
            wait_until(
                "a turn five steps in",
                lambda: Turn.objects.filter(job=job, position=2, steps__gte=5).exists(),
                120,
                processes,
            )
            server.kill()  # everything in Redis is gone: streams, counters, queued tasks
            server.start()
            state = wait_until("the job to end", lambda: job_state(job), 240, processes)
            assert state == JobState.COMPLETED, processes.logs()
            hospitals.join(60)
            assert_exact(hospitals)
        # A turn whose runner could not send (Redis gone) failed with the relay's error
        # and was retried from its checkpoints; none failed for another reason.
        reasons = [
            e.details["reason"]
            for e in AuditEvent.objects.filter(job_id=job.pk, action="turn.failed")
        ]
        assert all(r.startswith("ChannelError") or "relay error" in r for r in reasons), reasons
        # The hospitals saw the relay go: a read it cut short, or, for one that was
        # computing at the time, its streams' group gone at its next read (nothing lost:
        # the numbering went on, so no error).
        regrouped = [r for r in caplog.records if "lost its readers' group" in r.getMessage()]
        assert hospitals.relay_errors or regrouped, "the hospitals saw the relay go away"
    finally:
        server.stop()
