"""The agent's side of the training API: assignments with what a hand-off needs, a
long-poll, hand-off records and failed preconditions."""

from __future__ import annotations

import hashlib

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEvent
from tests.platform_apps.training.api.test_views import error, jobs, started
from training import services
from training.models import HandOff, Job, Turn

__all__ = ["jobs"]


@pytest.fixture
def agent_a(agent_client, hospital_a) -> APIClient:
    return agent_client(hospital_a)


def with_keys(*hospitals) -> None:
    for i, hospital in enumerate(hospitals):
        hospital.public_key = f"key-of-{i}"
        hospital.save(update_fields=["public_key"])


def test_assignments_name_the_participants_keys_and_whose_weights_to_start_from(
    agent_a, agent_client, hospital_a, hospital_c, jobs
) -> None:
    with_keys(hospital_a, hospital_c)
    job = started(jobs["ac"])
    (assignment,) = agent_a.get("/api/agent/assignments/").json()
    assert assignment["participants"] == [
        {"hospital": hospital_a.slug, "position": 0, "public_key": "key-of-0"},
        {"hospital": hospital_c.slug, "position": 1, "public_key": "key-of-1"},
    ]
    assert assignment["handoff_from"] is None, "the first turn starts from the job's seed"

    turn = Turn.objects.get(job=job, status="running")
    services.turn_finish(turn=turn, metrics={})
    digest = hashlib.sha256(b"sealed for c").hexdigest()
    body = {"turn": turn.pk, "recipient": hospital_c.slug, "ciphertext_sha256": digest}
    created = agent_a.post(
        f"/api/agent/assignments/{job.pk}/handoffs/", {**body, "size_bytes": 12}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["recipient"] == hospital_c.slug
    services.turn_start_next(job=job)

    (for_c,) = agent_client(hospital_c).get("/api/agent/assignments/").json()
    assert for_c["turn"]["status"] == "running"
    assert for_c["handoff_from"] == {
        "hospital": hospital_a.slug,
        "public_key": "key-of-0",
        "round": 0,
        "turn": turn.pk,
        "ciphertext_sha256": digest,
    }


def test_the_long_poll_answers_at_once_when_something_changed(agent_a, jobs) -> None:
    first = agent_a.get("/api/agent/assignments/")
    etag = first["ETag"]
    held = agent_a.get("/api/agent/assignments/", {"wait": 0.6, "etag": etag})
    assert held["ETag"] == etag and held.json() == first.json()
    started(jobs["ac"])
    changed = agent_a.get("/api/agent/assignments/", {"wait": 30, "etag": etag})
    assert changed["ETag"] != etag and len(changed.json()) == 1
    for bad in ("-1", "31", "soon"):
        assert "wait" in error(
            agent_a.get("/api/agent/assignments/", {"wait": bad}), 400, "invalid"
        )


def test_finished_jobs_stay_visible_so_agents_fetch_the_final_weights(agent_a, jobs) -> None:
    job = started(jobs["ac"])
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=job.started_at)
    (assignment,) = agent_a.get("/api/agent/assignments/").json()
    assert assignment["state"] == "completed"


def test_hand_offs_are_recorded_only_for_the_agents_own_turns(
    agent_a, agent_client, hospital_b, hospital_c, jobs
) -> None:
    job = started(jobs["bc"])
    turn = Turn.objects.get(job=job, status="running")
    body = {"turn": turn.pk, "recipient": hospital_c.slug, "ciphertext_sha256": "a" * 64}
    body["size_bytes"] = 1
    url = f"/api/agent/assignments/{job.pk}/handoffs/"
    error(agent_a.post(url, body, format="json"), 404, "not_found")
    agent_b = agent_client(hospital_b)
    details = error(
        agent_b.post(url, {**body, "recipient": "nowhere"}, format="json"), 400, "invalid"
    )
    assert "recipient" in details
    assert agent_b.post(url, body, format="json").status_code == 201
    assert HandOff.objects.get().sender == hospital_b


def test_a_failed_precondition_fails_the_turn_with_the_agents_reason(
    agent_a, hospital_a, jobs
) -> None:
    job = started(jobs["ac"])
    turn = Turn.objects.get(job=job, status="running")
    url = f"/api/agent/assignments/{job.pk}/problems/"
    reason = "images/0042.png: cannot be read (truncated PNG)"
    response = agent_a.post(url, {"turn": turn.pk, "reason": reason}, format="json")
    assert response.status_code == 200, response.content
    turn.refresh_from_db()
    assert turn.status == "failed"
    assert turn.failure_reason == f"{hospital_a.slug} reported a failed precondition: {reason}"
    reported = AuditEvent.objects.get(action="turn.problem_reported")
    assert reported.actor_kind == "hospital" and reported.details == {"reason": reason}
    again = agent_a.post(url, {"turn": turn.pk, "reason": reason}, format="json")
    error(again, 409, "conflict")
    assert "reason" in error(
        agent_a.post(url, {"turn": turn.pk, "reason": " "}, format="json"), 400, "invalid"
    )
