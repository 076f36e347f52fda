"""Selectors: who sees which job, and the status summary's cost."""

from __future__ import annotations

import pytest

from kernel.errors import NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor
from training import selectors, services
from training.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job_bc(make_job, hospital_b, hospital_c) -> Job:
    """A job hospital A (and so its admin) takes no part in."""
    return make_job(participants=[{"hospital": hospital_b.slug}, {"hospital": hospital_c.slug}])


def test_hospital_admin_sees_only_jobs_of_their_hospital(
    make_job, job_bc, hospital_admin_actor, admin_actor, observer_actor
) -> None:
    own = make_job()
    assert list(selectors.jobs_visible_to(actor=hospital_admin_actor)) == [own]
    for actor in (admin_actor, observer_actor):
        assert set(selectors.jobs_visible_to(actor=actor)) == {own, job_bc}
    with pytest.raises(NotFound):
        selectors.job_get(actor=hospital_admin_actor, job_id=job_bc.pk)
    with pytest.raises(NotFound):
        selectors.job_status(actor=hospital_admin_actor, job_id=job_bc.pk)


def test_agents_read_assignments_not_jobs(make_job, hospital_a) -> None:
    job = make_job()
    with pytest.raises(PermissionDenied):
        selectors.jobs_visible_to(actor=agent_actor(hospital_a))
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    assert list(selectors.agent_assignments(actor=agent_actor(hospital_a))) == [job]


@pytest.mark.parametrize("who", ["admin_actor", "hospital_admin_actor"])
def test_status_takes_two_queries(
    make_job, request, who, django_assert_num_queries, hospital_a
) -> None:
    job = make_job(state="scheduled")
    services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    services.turn_record_progress(
        turn=turn, steps=2, samples=32, bytes_up=10, bytes_down=9, loss=0.3
    )
    actor = request.getfixturevalue(who)
    with django_assert_num_queries(2):
        status = selectors.job_status(actor=actor, job_id=job.pk)
    assert status["hospital"] == hospital_a.slug and status["last_loss"] == 0.3
    assert status["totals"]["bytes_up"] == 10


def test_assignments_take_a_bounded_number_of_queries(
    make_job, hospital_a, django_assert_max_num_queries
) -> None:
    for _ in range(3):
        services.job_start(job=make_job(state="scheduled"))
    # The secure aggregation attempts: one more; the evaluations of its final model: one more.
    with django_assert_max_num_queries(8):
        jobs = list(selectors.agent_assignments(actor=agent_actor(hospital_a)))
        assert all(job.my_turns and job.my_participation for job in jobs)
    assert len(jobs) == 3
