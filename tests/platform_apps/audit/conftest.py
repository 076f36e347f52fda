"""Fixtures of the audit tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from audit.models import AuditEvent
from audit.services import audit_record
from kernel.actors import Actor, ActorKind


@pytest.fixture
def system_actor() -> Actor:
    return Actor(ActorKind.SYSTEM, source_ip="10.0.0.1")


@pytest.fixture
def record_many(db: None, system_actor: Actor) -> Callable[[int], list[AuditEvent]]:
    """Append ``n`` events by the system, each with its number in its details."""

    def record(n: int) -> list[AuditEvent]:
        return [
            audit_record(actor=system_actor, action="test.step", details={"n": i}) for i in range(n)
        ]

    return record
