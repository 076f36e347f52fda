"""A hospital's agent reports a hijacking server: the turn fails, the audit log records
``job.hijack_suspected``, and the job and the hospital show the alert."""

from __future__ import annotations

from audit.models import AuditEvent
from medsplit.defenses.hijack import HijackDetected
from tests.platform_apps.training.api.test_agent_views import agent_a
from tests.platform_apps.training.api.test_views import jobs, started
from training.models import Turn

__all__ = ["agent_a", "jobs"]


def test_a_hijack_report_is_audited_and_shown_on_the_job_and_the_hospital(
    agent_a, hospital_a, jobs, client_for, consortium_admin
) -> None:
    job = started(jobs["ac"])
    turn = Turn.objects.get(job=job, status="running")
    reason = str(HijackDetected(step=2, outliers=3, window=3, score=7.5))
    url = f"/api/agent/assignments/{job.pk}/problems/"
    assert agent_a.post(url, {"turn": turn.pk, "reason": reason}, format="json").status_code == 200
    event = AuditEvent.objects.get(action="job.hijack_suspected")
    assert (event.hospital, event.job_id) == (hospital_a.slug, job.pk)
    assert event.details == {"turn": turn.pk, "reason": reason}
    admin = client_for(consortium_admin)
    (alert,) = admin.get(f"/api/jobs/{job.pk}/").json()["hijack_alerts"]
    assert (alert["hospital"], alert["turn"], alert["reason"]) == (hospital_a.slug, turn.pk, reason)
    (alert,) = admin.get(f"/api/hospitals/{hospital_a.slug}/").json()["hijack_alerts"]
    assert (alert["job"], alert["reason"]) == (job.pk, reason)


def test_another_problem_raises_no_hijack_alert(agent_a, jobs) -> None:
    job = started(jobs["ac"])
    turn = Turn.objects.get(job=job, status="running")
    url = f"/api/agent/assignments/{job.pk}/problems/"
    agent_a.post(url, {"turn": turn.pk, "reason": "images/1.png: truncated"}, format="json")
    assert not AuditEvent.objects.filter(action="job.hijack_suspected").exists()
