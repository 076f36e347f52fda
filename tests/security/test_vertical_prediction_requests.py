"""A vertical job's prediction asked for by the wrong caller, or when a party is away:
refused at once, naming who may ask or who is offline, and nothing starts. The label
party's request with every agent online starts one part per party, audited as a count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from hospitals.models import Hospital
from training.models import Evaluation, HospitalEvaluation, Job

pytestmark = pytest.mark.django_db


def _vertical(make_job, a, b, state: str = "completed") -> Job:
    job = make_job(
        state=state,
        mode="vertical",
        cuts=["pool1", "pool"],
        mode_options={"min_records": 10},
        participants=[{"hospital": a.slug}, {"hospital": b.slug}],
    )
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now())
    return job


def _ask(agent_client, job: Job, hospital, records: int = 5):
    return agent_client(hospital).post(
        f"/api/agent/assignments/{job.pk}/vertical-predictions/",
        {"records": records},
        format="json",
    )


def _online(*hospitals) -> None:
    Hospital.objects.filter(pk__in=[h.pk for h in hospitals]).update(last_seen_at=timezone.now())


def test_only_the_label_party_of_a_completed_job_may_ask(
    make_job, agent_client, three_hospitals, settings
) -> None:
    a, b, c = three_hospitals
    _online(a, b, c)
    job = _vertical(make_job, a, b)
    outsider = _ask(agent_client, job, c)
    assert outsider.status_code == 404, outsider.json()
    passive = _ask(agent_client, job, b)
    assert passive.status_code == 409, passive.json()
    assert f"label party, {a.slug}" in passive.json()["message"]
    running = _vertical(make_job, a, b, state="running")
    refused = _ask(agent_client, running, a)
    assert refused.status_code == 409 and "only a completed job" in refused.json()["message"]
    assert _ask(agent_client, job, a, 10**9).status_code == 400
    assert not Evaluation.objects.filter(purpose="prediction").exists()


def test_a_party_offline_refuses_the_request_naming_it(
    make_job, agent_client, three_hospitals, settings
) -> None:
    a, b, _ = three_hospitals
    job = _vertical(make_job, a, b)
    window = settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"]
    _online(a)
    Hospital.objects.filter(pk=b.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=window + 5)
    )
    refused = _ask(agent_client, job, a)
    assert refused.status_code == 409, refused.json()
    assert f"{b.slug} sent no heartbeat" in refused.json()["message"]
    assert a.slug not in refused.json()["message"].split(";")[1]
    assert not Evaluation.objects.filter(purpose="prediction").exists()

    _online(b)
    accepted = _ask(agent_client, job, a, 5)
    assert accepted.status_code == 202, accepted.json()
    body = accepted.json()
    parts = list(HospitalEvaluation.objects.filter(job=job).order_by("position"))
    assert [p.hospital_id for p in parts] == [a.pk, b.pk]
    assert [p.test_samples for p in parts] == [5, 5] and body["prediction"] == parts[0].pk
    assert parts[0].evaluation.purpose == "prediction"
    # The passive party's agent sees its part as a prediction, not as an evaluation.
    seen = agent_client(b).get(f"/api/agent/assignments/{job.pk}/").json()
    assert seen["prediction"]["id"] == parts[1].pk and seen["evaluation"] is None
    again = _ask(agent_client, job, a, 5)
    assert again.status_code == 409 and "still running" in again.json()["message"]
    (event,) = AuditEvent.objects.filter(action="prediction.requested", job_id=job.pk)
    assert event.details == {"attempt": parts[0].evaluation.attempt, "records": 5}
