"""training.alignment: the parties' intersection digests compared at the coordinator."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from kernel.errors import InvalidInput, NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor
from training import services
from training.alignment import alignment_get, alignment_report, alignment_summary
from training.models import Job, JobAlignment
from training.states import JobState

pytestmark = pytest.mark.django_db

DIGEST = "ab" * 32
OTHER = "cd" * 32


def running(make_job, minimum: int | None = 10) -> Job:
    """A running vertical job (its minimum intersection ``minimum``, or the mode's)."""
    options = {} if minimum is None else {"min_records": minimum}
    job = services.job_start(
        job=make_job(
            state="scheduled", mode="vertical", cuts=["pool1", "pool"], mode_options=options
        )
    )
    assert job.state == JobState.RUNNING
    return job


def test_a_job_of_another_mode_aligns_nothing(make_job, three_hospitals) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    with pytest.raises(InvalidInput, match="aligns no records"):
        report(job, three_hospitals[0])


def report(job: Job, hospital, digest: str = DIGEST, size: int = 40) -> JobAlignment:
    return alignment_report(actor=agent_actor(hospital), job_id=job.pk, digest=digest, size=size)


def actions(job: Job) -> list[str]:
    return list(
        AuditEvent.objects.filter(job_id=job.pk, action__startswith="alignment.")
        .order_by("id")
        .values_list("action", flat=True)
    )


def test_every_party_with_the_same_digest_agrees(make_job, three_hospitals) -> None:
    job = running(make_job)
    a, b, c = three_hospitals
    assert report(job, a).status == JobAlignment.Status.PENDING
    assert report(job, b).status == JobAlignment.Status.PENDING
    state = alignment_get(actor=agent_actor(c), job_id=job.pk)
    assert state["status"] == "pending" and state["reported"] == 2 and state["parties"] == 3
    assert report(job, a).status == JobAlignment.Status.PENDING  # the same again: nothing
    alignment = report(job, c)
    assert alignment.status == JobAlignment.Status.AGREED and alignment.size == 40
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert actions(job) == ["alignment.agreed"]
    event = AuditEvent.objects.get(job_id=job.pk, action="alignment.agreed")
    assert event.details == {"size": 40}  # the size only
    assert report(job, b).status == JobAlignment.Status.AGREED  # a restarted agent


def test_a_different_digest_fails_the_job(make_job, three_hospitals) -> None:
    job = running(make_job)
    a, b, c = three_hospitals
    report(job, a)
    report(job, b, OTHER, size=41)
    alignment = report(job, c)
    assert alignment.status == JobAlignment.Status.MISMATCH
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "the parties hold different intersections" in job.state_reason
    assert b.slug in job.state_reason and "nothing is trained" in job.state_reason
    assert actions(job) == ["alignment.mismatch"]
    state = alignment_get(actor=agent_actor(a), job_id=job.pk)
    assert state["status"] == "mismatch" and "different intersections" in state["reason"]
    assert DIGEST not in str(state) and OTHER not in str(state)


def test_a_party_changing_its_digest_is_a_mismatch(make_job, three_hospitals) -> None:
    job = running(make_job)
    b = three_hospitals[1]
    for h in three_hospitals:
        report(job, h)
    assert report(job, b, OTHER).status == JobAlignment.Status.MISMATCH
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "its records changed" in job.state_reason


def test_the_label_party_below_the_minimum_fails_the_job_at_once(make_job, three_hospitals) -> None:
    job = running(make_job, minimum=50)
    a, b, _ = three_hospitals
    report(job, b)  # another party's size decides nothing
    alignment = report(job, a, size=49)
    assert alignment.status == JobAlignment.Status.TOO_SMALL and alignment.size == 49
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "too small" in job.state_reason and "below the job's minimum of 50" in job.state_reason
    assert actions(job) == ["alignment.too_small"]
    state = alignment_get(actor=agent_actor(b), job_id=job.pk)
    assert state == {
        "status": "too_small",
        "size": 49,
        "reported": 2,
        "parties": 3,
        "minimum": 50,
        "reason": job.state_reason,
    }


def test_an_empty_intersection_is_too_small(make_job, three_hospitals) -> None:
    job = running(make_job, minimum=None)  # the default minimum
    assert report(job, three_hospitals[0], size=0).status == JobAlignment.Status.TOO_SMALL


def test_reports_are_checked(make_job, three_hospitals, hospital_admin_actor) -> None:
    job = running(make_job)
    with pytest.raises(InvalidInput):
        report(job, three_hospitals[0], digest="AB" * 32)
    with pytest.raises(InvalidInput):
        report(job, three_hospitals[0], size=-1)
    with pytest.raises(PermissionDenied):
        alignment_report(actor=hospital_admin_actor, job_id=job.pk, digest=DIGEST, size=3)
    with pytest.raises(NotFound):
        report(Job(pk=job.pk + 1000), three_hospitals[0])


def test_the_job_serves_its_alignment_state(
    make_job, three_hospitals, client_for, consortium_admin
) -> None:
    job = running(make_job)
    # Pending before any party reported; a job of another mode has none.
    assert alignment_summary(job)["status"] == "pending"
    assert alignment_summary(job)["reported"] == 0
    assert alignment_summary(services.job_start(job=make_job(state="scheduled"))) is None
    report(job, three_hospitals[0])
    client = client_for(consortium_admin)
    body = client.get(f"/api/jobs/{job.pk}/").json()
    assert body["alignment"]["status"] == "pending" and body["alignment"]["reported"] == 1
    for h in three_hospitals[1:]:
        report(job, h)
    body = client.get(f"/api/jobs/{job.pk}/").json()
    assert body["alignment"] == {
        "status": "agreed",
        "size": 40,
        "reported": 3,
        "parties": 3,
        "minimum": 10,
        "reason": "",
    }
    assert DIGEST not in str(body)


def test_the_agent_endpoint(make_job, three_hospitals, agent_client) -> None:
    job = running(make_job)
    client = agent_client(three_hospitals[0])
    url = f"/api/agent/assignments/{job.pk}/alignment/"
    assert client.get(url).json()["status"] == "pending"
    response = client.post(url, {"digest": DIGEST, "size": 12}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["reported"] == 1
    assert client.post(url, {"digest": DIGEST, "size": "12"}, format="json").status_code == 400
