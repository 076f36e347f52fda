"""Writing to the audit log."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from coordinator.actors import Actor

GENESIS = "0" * 64


@transaction.atomic
def audit_record(
    *,
    actor: Actor,
    action: str,
    target: str = "",
    hospital: str = "",
    job_id: int | None = None,
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event (``action`` like ``hospital.approved``) to the audit log.

    Args:
        actor: who did it.
        action: dotted name of what happened.
        target: what it happened to, e.g. ``hospital:st-marys`` or ``job:12``.
        hospital: slug of the hospital the event concerns, for per-hospital views.
        job_id: the job the event concerns, if any.
        details: JSON-ready facts (sizes, states); never patient data.
    """
    last = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first()
    event = AuditEvent(
        created_at=timezone.now(),
        actor_kind=actor.kind.value,
        actor=actor.label,
        action=action,
        target=target,
        hospital=hospital,
        job_id=job_id,
        details=dict(details or {}),
        source_ip=actor.source_ip,
        prev_hash=last or GENESIS,
    )
    event.hash = hashlib.sha256(
        json.dumps([event.prev_hash, action, target, actor.label], sort_keys=True).encode()
    ).hexdigest()
    event.save()
    return event
