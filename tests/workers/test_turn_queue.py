"""Scaling out with a queue for turns: with ``MEDSPLIT_CELERY_TURN_QUEUE`` set, every
turn runs on a worker consuming that queue, and the scheduler's tasks on one that
consumes the default queue, so a long turn never holds up scheduling."""

from __future__ import annotations

import uuid

import pytest

from kernel.actors import Actor
from medsplit.training.verify import deterministic
from tests.workers.hospitals import Hospitals, assert_exact, local_data, report_sizes
from tests.workers.processes import Processes, processes, wait_until
from training import services
from training.models import Turn
from training.states import JobState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

__all__ = ["processes"]


def test_turns_run_only_on_the_workers_of_the_turn_queue(
    processes: Processes, redis_url: str, make_job, admin_actor: Actor
) -> None:
    turn_queue = f"{processes.env['MEDSPLIT_CELERY_QUEUE']}.turns"
    processes.env["MEDSPLIT_CELERY_TURN_QUEUE"] = turn_queue
    processes.celery_worker("scheduler")  # the default queue only
    processes.celery_worker("turns", queues=turn_queue)
    processes.celery_beat()
    job = make_job(seed=uuid.uuid4().int % 1000, rounds=1, max_steps_per_turn=3)
    train, val = local_data(job, 16 * 3), local_data(job, 16)
    report_sizes(job, train, val)  # before a worker can claim a turn and check against them
    job = services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    with deterministic():
        hospitals = Hospitals(job, redis_url, train, val).start()

        def ended() -> str:
            job.refresh_from_db()
            return job.state if job.state in (JobState.COMPLETED, JobState.FAILED) else ""

        assert wait_until("the job to end", ended, 180, processes) == JobState.COMPLETED
        hospitals.join(60)
        assert_exact(hospitals)
    # Celery logs each task a worker receives ("Task medsplit.run_turn[<id>] received").
    turns_log = (processes.folder / "turns.log").read_text()
    scheduler_log = (processes.folder / "scheduler.log").read_text()
    assert turns_log.count("medsplit.run_turn[") >= Turn.objects.filter(job=job).count() == 3
    assert "medsplit.advance_job[" not in turns_log
    assert "medsplit.advance_job[" in scheduler_log
    assert "medsplit.run_turn[" not in scheduler_log
