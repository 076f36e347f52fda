"""Fixtures of the audit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from audit.models import AuditEvent
from audit.services import audit_record
from coordinator.actors import Actor, ActorKind
from tests.platform.audit.support import flush_past_audit_triggers


@pytest.fixture(autouse=True, scope="session")
def _flush_past_audit_triggers() -> Iterator[None]:
    with flush_past_audit_triggers():
        yield


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    """The shared fixtures make people with passwords; the default hasher takes about a
    second per person on a small machine, which these tests do not need to prove."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
