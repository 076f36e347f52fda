"""The runtime services under concurrent calls: the job's row lock lets one win.

These need a database with row locks (PostgreSQL); run them with
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/medsplit_jobs``.
"""

from __future__ import annotations

import threading

import pytest

from audit.models import AuditEvent
from tests.platform_apps.concurrency import race
from training import services
from training.models import Job, Turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("needs_postgres")]


def test_racing_schedulers_start_one_turn(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    results = race(lambda: services.turn_start_next(job=job), n=3)
    assert len({turn.pk for turn in results}) == 1, results
    assert Turn.objects.filter(job=job, status="running").count() == 1
    assert AuditEvent.objects.filter(job_id=job.pk, action="turn.started").count() == 1


def test_racing_schedulers_start_a_parallel_group_once(make_job, monkeypatch) -> None:
    from medsplit.modes import MODES
    from tests.medsplit.test_modes import TOY

    monkeypatch.setitem(MODES, TOY.name, TOY)  # every hospital in one group
    job = services.job_start(job=make_job(state="scheduled", mode="toy"))
    results = race(lambda: services.group_start_next(job=job), n=3)
    assert {tuple(t.pk for t in group) for group in results} == {
        tuple(Turn.objects.filter(job=job).order_by("position").values_list("pk", flat=True))
    }
    assert Turn.objects.filter(job=job, status="running").count() == 3
    assert AuditEvent.objects.filter(job_id=job.pk, action="turn.started").count() == 3


def test_racing_failures_queue_one_retry(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled", on_failure="retry", max_retries=2))
    turn = services.turn_start_next(job=job)
    race(lambda: services.turn_fail(turn=turn, reason="lost"), n=3)
    assert list(Turn.objects.filter(job=job, position=0).values_list("attempt", "status")) == [
        (1, "failed"),
        (2, "pending"),
    ]


def test_finish_racing_cancel_leaves_a_consistent_job(make_job, admin_actor) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    calls = iter(
        [
            lambda: services.turn_finish(turn=turn, metrics={}),
            lambda: services.job_transition(job=job, to="cancelled", actor=admin_actor),
        ]
    )
    lock = threading.Lock()

    def one() -> object:
        with lock:
            call = next(calls)
        return call()

    race(one, n=2)
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    # Either the turn finished first, or the cancel failed it: never still running.
    assert Turn.objects.get(pk=turn.pk).status in ("completed", "failed")
    assert not Turn.objects.filter(job=job, status__in=["running", "pending"]).exists()
