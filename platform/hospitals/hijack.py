"""A hospital's agent found the server hijacking a job: the audit event and the alerts.

The agent says so through the turn-problem path (``POST .../problems/``) with a reason
that begins with :data:`medsplit.defenses.hijack.REASON_PREFIX`; the turn fails there as
for any failed precondition. This module adds what a hijack report means beyond that:
an audit event of its own, ``job.hijack_suspected``, and the alerts the dashboard shows
on the job and on the hospital, read back from those events (the audit log is their one
record, chained and witnessed).
"""

from __future__ import annotations

from typing import Any

from audit.models import AuditEvent
from audit.services import audit_record
from kernel.actors import Actor
from medsplit.defenses.hijack import REASON_PREFIX

ACTION = "job.hijack_suspected"


def is_hijack_report(reason: str) -> bool:
    """Whether an agent's problem report says its detector found a hijacking server."""
    return reason.startswith(REASON_PREFIX)


def record_hijack_report(*, actor: Actor, job_id: int, turn_id: int, reason: str) -> None:
    """Audit a hijack report (in the caller's transaction, with the turn's failure)."""
    audit_record(
        actor=actor,
        action=ACTION,
        target=f"job:{job_id}",
        hospital=actor.hospital.slug,
        job_id=job_id,
        details={"turn": turn_id, "reason": reason},
    )


def hijack_alerts(
    *, job_id: int | None = None, hospital: str | None = None
) -> list[dict[str, Any]]:
    """The hijack reports on a job, or by a hospital, oldest first: who, which job and
    turn, when, and the agent's reason."""
    events = AuditEvent.objects.filter(action=ACTION)
    if job_id is not None:
        events = events.filter(job_id=job_id)
    if hospital is not None:
        events = events.filter(hospital=hospital)
    return [
        {
            "hospital": e.hospital,
            "job": e.job_id,
            "turn": e.details.get("turn"),
            "reason": e.details.get("reason", ""),
            "at": e.created_at,
        }
        for e in events.order_by("id")
    ]
