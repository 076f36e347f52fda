"""The scheduler's choices and its hooks: which jobs and turns need a worker, the
dispatcher called when a job is scheduled or resumed, the tasks sent to the broker."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from kernel.actors import Actor
from training import services
from training.models import Turn
from training.scheduling import job_advance, jobs_to_advance, turns_without_runner
from training.states import JobState

pytestmark = pytest.mark.django_db

CALLS: list[int] = []


class RecordingDispatcher:
    def job_changed(self, job_id: int) -> None:
        CALLS.append(job_id)


class BrokenDispatcher:
    def job_changed(self, job_id: int) -> None:
        raise ConnectionError("broker down")


@pytest.fixture
def recording(settings):
    CALLS.clear()
    path = "tests.workers.test_scheduling.RecordingDispatcher"
    settings.MEDSPLIT = {**settings.MEDSPLIT, "JOB_DISPATCHER": path, "TURN_LEASE_SECONDS": 30}
    return CALLS


def test_scheduling_and_resuming_call_the_dispatcher_after_commit(
    recording, make_job, admin_actor: Actor, django_capture_on_commit_callbacks
) -> None:
    job = make_job()
    with django_capture_on_commit_callbacks(execute=True):
        services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    assert recording == [job.pk]
    with django_capture_on_commit_callbacks(execute=True):
        job_advance(job_id=job.pk)  # the system's start is not announced again
        services.job_transition(job=job, to=JobState.PAUSED, actor=admin_actor)
    assert recording == [job.pk]
    with django_capture_on_commit_callbacks(execute=True):
        services.job_transition(job=job, to=JobState.RUNNING, actor=admin_actor)
    assert recording == [job.pk, job.pk]


def test_a_failing_dispatcher_is_logged_and_the_request_still_succeeds(
    settings, make_job, admin_actor: Actor, django_capture_on_commit_callbacks, caplog
) -> None:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "JOB_DISPATCHER": "tests.workers.test_scheduling.BrokenDispatcher",
    }
    job = make_job()
    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert f"could not notify the workers about job {job.pk}" in caplog.text


def test_the_sweep_finds_scheduled_jobs_and_turns_whose_runner_is_gone(
    recording, make_job, admin_actor: Actor
) -> None:
    job = make_job(state="scheduled")
    assert jobs_to_advance() == [job.pk]
    turn = job_advance(job_id=job.pk)
    assert turn is not None and turn.position == 0
    assert jobs_to_advance() == [], "a running job with a running turn needs no advance"
    assert turns_without_runner() == [turn.pk], "started, never sent to a worker"

    now = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(dispatched_at=now)
    assert turns_without_runner() == [], "sent moments ago: it may be queued"
    Turn.objects.filter(pk=turn.pk).update(
        runner="w:1:a", lease_expires_at=now + timedelta(seconds=30), dispatched_at=None
    )
    assert turns_without_runner() == [], "a live lease"
    Turn.objects.filter(pk=turn.pk).update(lease_expires_at=now - timedelta(seconds=1))
    assert turns_without_runner() == [turn.pk], "the lease expired: the runner died"
    assert job_advance(job_id=job.pk) == Turn.objects.get(pk=turn.pk)


def test_the_sweep_leaves_a_turn_that_just_ended_to_its_follow_up(
    recording, make_job, settings
) -> None:
    # A sweep queued behind a turn runs just before the follow-up its runner sent: it must
    # not send a second advance_job (and with it a second run_turn) into the hand-over.
    job = make_job(state="scheduled")
    turn = job_advance(job_id=job.pk)
    assert turn is not None
    ended = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.COMPLETED, finished_at=ended)
    assert jobs_to_advance(now=ended + timedelta(seconds=1)) == []
    later = ended + timedelta(seconds=settings.MEDSPLIT["SWEEP_SECONDS"] + 1)
    assert jobs_to_advance(now=later) == [job.pk], "a follow-up lost: the next sweep sends it"


def test_the_celery_dispatcher_puts_the_scheduler_task_on_the_broker(
    settings, redis_url: str
) -> None:
    from workers.celery_app import app
    from workers.dispatch import CeleryDispatcher

    if not redis_url.startswith("redis://"):
        pytest.skip("the broker URL of this test needs a TCP Redis")
    queue = f"celery.test-{uuid.uuid4().hex[:8]}"
    old = (app.conf.broker_url, app.conf.task_default_queue)
    app.conf.broker_url, app.conf.task_default_queue = redis_url, queue
    client = redis.Redis.from_url(redis_url)
    try:
        CeleryDispatcher().job_changed(4242)
        # Under kombu's global_keyprefix: the deployment's prefix (coordinator/settings.py).
        key = app.conf.broker_transport_options["global_keyprefix"] + queue
        assert key.startswith(f"{settings.MEDSPLIT['RELAY_PREFIX']}:celery:")
        messages = client.lrange(key, 0, -1)
        assert len(messages) == 1
        assert b"medsplit.advance_job" in messages[0]
    finally:
        app.conf.broker_url, app.conf.task_default_queue = old
        client.delete(key)
        client.close()
