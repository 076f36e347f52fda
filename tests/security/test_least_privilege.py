"""Least privilege in what people and agents see of the others in a job, attacked: hospital
A's admin and agent read everything they can about a job with hospitals B and C, and
look for B's losses, metrics, counters and failure reasons (kernel/permissions.py, the
rule). Before: a hospital admin got every participant's per-turn metrics, per-step losses
and failure reasons, and an agent's ``state_reason`` named another hospital's failure.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from kernel.actors import Role
from tests.platform_apps.conftest import make_person
from training import services
from training.models import Job, MetricPoint, Round, Turn

pytestmark = pytest.mark.django_db

#: What only B (and the consortium's admins and observers) may see: each would give B
#: away if it showed up in an answer to A.
B_SECRET_REASON = "/data/b/patient-0417.dcm unreadable: truncated pixel data"
B_LOSS, B_ACCURACY, B_STEPS, B_BYTES = 0.8123457, 0.6543217, 4321, 9876543
A_LOSS, A_ACCURACY, A_STEPS, A_BYTES = 0.2345671, 0.9123457, 1234, 5555555

#: Of another hospital's turn, all a hospital admin sees.
SHOWN_OF_OTHERS_TURNS = {"id", "round", "position", "attempt", "hospital", "status", "samples"}
SHOWN_OF_OTHER_PARTICIPANTS = {"position", "hospital", "hospital_name"}


def _shows(text: str, secret: str) -> bool:
    """Whether ``secret`` is in ``text`` as itself: a number inside a random hex name
    (B's 4321 in an agent's ``test-8432152c5a``) is not it."""
    return re.search(rf"(?<![0-9A-Za-z]){re.escape(secret)}(?![0-9A-Za-z])", text) is not None


SECRETS = [
    B_SECRET_REASON,
    "patient-0417",
    str(B_LOSS),
    str(B_ACCURACY),
    str(B_STEPS),
    str(B_BYTES),
]


@pytest.fixture
def failed_job(make_job, three_hospitals) -> Job:
    """A job of A, B and C: A's turn completed (metrics, points), B's failed with a
    reason that names a file and failed the job; C never ran."""
    a, b, _ = three_hospitals
    job = make_job("running", on_failure="fail")
    now = timezone.now()
    first = Round.objects.create(job=job, index=0, started_at=now - timedelta(minutes=5))
    turns = {}
    for hospital, position, loss, accuracy, steps, sent, status in (
        (a, 0, A_LOSS, A_ACCURACY, A_STEPS, A_BYTES, Turn.Status.COMPLETED),
        (b, 1, B_LOSS, B_ACCURACY, B_STEPS, B_BYTES, Turn.Status.RUNNING),
    ):
        turns[hospital.slug] = Turn.objects.create(
            job=job, round=first, hospital=hospital, position=position, status=status,
            started_at=now - timedelta(minutes=4 - position), steps=steps, samples=640,
            bytes_up=sent, bytes_down=sent, last_loss=loss,
            metrics={"val_accuracy": accuracy, "val_loss": loss},
        )  # fmt: skip
        for step in (1, 2):
            MetricPoint.objects.create(
                job=job, turn=turns[hospital.slug], step=step, time=now, loss=loss,
                samples=16 * step, bytes_up=sent, bytes_down=sent,
            )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(current_round=0, current_turn=turns[b.slug])
    services.turn_fail(turn=turns[b.slug], reason=B_SECRET_REASON)
    job.refresh_from_db()
    assert job.state == "failed" and B_SECRET_REASON in job.state_reason
    return job


def _text(response) -> str:
    assert response.status_code == 200, response.content
    return json.dumps(response.json())


def _everything(client, job: Job) -> dict[str, dict]:
    return {
        "detail": client.get(f"/api/jobs/{job.pk}/"),
        "list": client.get("/api/jobs/"),
        "status": client.get(f"/api/jobs/{job.pk}/status/"),
        "turns": client.get(f"/api/jobs/{job.pk}/turns/"),
        "metrics": client.get(f"/api/jobs/{job.pk}/metrics/"),
    }


def test_a_hospital_admin_sees_of_the_others_names_positions_states_and_samples_only(
    client_for, hospital_admin, failed_job, hospital_a, hospital_b
) -> None:
    hal = client_for(hospital_admin)
    answers = _everything(hal, failed_job)
    for name, response in answers.items():
        text = _text(response)
        for secret in SECRETS:
            assert not _shows(text, secret), f"{name} shows {secret!r}"

    detail = answers["detail"].json()
    for participant in detail["participants"]:
        if participant["hospital"] == hospital_a.slug:
            assert "feature_set" in participant  # their own hospital: in full
        else:
            assert set(participant) == SHOWN_OF_OTHER_PARTICIPANTS
    assert detail["state_reason"].startswith(f"turn {failed_job.current_turn_id} of city-general")
    assert "its reason is shown to city-general" in detail["state_reason"]
    listed = answers["list"].json()["results"][0]
    assert listed["state_reason"] == detail["state_reason"]

    turns = answers["turns"].json()["results"]
    mine = next(t for t in turns if t["hospital"] == hospital_a.slug)
    assert mine["metrics"] == {"val_accuracy": A_ACCURACY, "val_loss": A_LOSS}
    assert mine["last_loss"] == A_LOSS and mine["steps"] == A_STEPS
    theirs = next(t for t in turns if t["hospital"] == hospital_b.slug)
    assert set(theirs) == SHOWN_OF_OTHERS_TURNS
    assert theirs["status"] == "failed" and theirs["samples"] == 640

    points = answers["metrics"].json()["results"]
    assert {p["turn"] for p in points} == {mine["id"]}  # per-step losses: their own only
    only_theirs = hal.get(f"/api/jobs/{failed_job.pk}/metrics/", {"turn": theirs["id"]})
    assert only_theirs.json()["results"] == []

    status = answers["status"].json()
    assert set(status["turn"]) == {"id", "position", "attempt", "status", "hospital", "samples"}
    assert status["last_loss"] is None  # the current turn is B's
    assert status["totals"] == {  # over their own hospital's turn
        "steps": A_STEPS, "samples": 640, "bytes_up": A_BYTES, "bytes_down": A_BYTES,
    }  # fmt: skip


@pytest.mark.parametrize("role", [Role.CONSORTIUM_ADMIN, Role.OBSERVER])
def test_consortium_admins_and_observers_see_everything_as_before(
    client_for, failed_job, role
) -> None:
    client = client_for(make_person(f"someone-{role.value}", role))
    answers = _everything(client, failed_job)
    assert B_SECRET_REASON in answers["detail"].json()["state_reason"]
    turns = answers["turns"].json()["results"]
    assert all("failure_reason" in t and "metrics" in t for t in turns)
    assert B_SECRET_REASON in _text(answers["turns"])
    assert len({p["turn"] for p in answers["metrics"].json()["results"]}) == 2
    status = answers["status"].json()
    assert status["last_loss"] == B_LOSS and status["turn"]["steps"] == B_STEPS
    assert status["totals"]["samples"] == 2 * 640


def test_an_agent_sees_its_own_failure_reasons_only(
    agent_client, failed_job, hospital_a, hospital_b
) -> None:
    a = agent_client(hospital_a)
    for response in (
        a.get("/api/agent/assignments/"),
        a.get(f"/api/agent/assignments/{failed_job.pk}/"),
    ):
        text = _text(response)
        for secret in SECRETS:
            assert secret not in text
    assignment = a.get(f"/api/agent/assignments/{failed_job.pk}/").json()
    assert "its reason is shown to city-general" in assignment["state_reason"]

    b = agent_client(hospital_b).get(f"/api/agent/assignments/{failed_job.pk}/").json()
    assert B_SECRET_REASON in b["state_reason"]  # its own
