"""The export endpoints answer the services' refusals as 4xx naming what was wrong."""

from __future__ import annotations

import pytest

from tests.platform_apps.conftest import make_hospital

pytestmark = pytest.mark.django_db


def test_request_approve_and_refuse_over_the_api(
    make_job, three_hospitals, consortium_admin, hospital_admin, client_for, agent_client
) -> None:
    job = make_job("completed")
    url = f"/api/jobs/{job.pk}/exports/"
    body = {"recipient": three_hospitals[2].slug}
    assert client_for(hospital_admin).post(url, body, format="json").status_code == 403
    made = client_for(consortium_admin).post(url, body, format="json")
    assert made.status_code == 201, made.content
    export_id = made.json()["id"]
    first = agent_client(three_hospitals[0])
    assert first.post(f"/api/agent/exports/{export_id}/approve/").json()["state"] == "pending"
    again = first.post(f"/api/agent/exports/{export_id}/approve/")
    assert again.status_code == 409 and "already approved" in again.content.decode()
    refused = agent_client(three_hospitals[1]).post(
        f"/api/agent/exports/{export_id}/refuse/", {"reason": "no"}, format="json"
    )
    assert refused.json()["state"] == "refused"
    assert refused.json()["refused_by"] == three_hospitals[1].slug


def test_an_agent_sees_its_export_with_the_parts_it_waits_for(
    make_job, three_hospitals, consortium_admin, client_for, agent_client
) -> None:
    job = make_job("completed")
    made = client_for(consortium_admin).post(
        f"/api/jobs/{job.pk}/exports/", {"recipient": three_hospitals[1].slug}, format="json"
    )
    url = f"/api/agent/exports/{made.json()['id']}/"
    seen = agent_client(three_hospitals[0]).get(url).json()
    others = sorted(h.slug for h in three_hospitals if h != three_hospitals[1])
    assert seen["expected_parts"] == [*others, "server"]
    assert seen["parts"] == [] and seen["recipient_key"] is None
    assert len(seen["server_identity"]) == 2604  # base64 of an ML-DSA-65 public key
    assert agent_client(make_hospital("outsider")).get(url).status_code == 404
