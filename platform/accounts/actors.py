"""Actors the coordinator's own Actor type has no constructor for yet."""

from __future__ import annotations

from coordinator.actors import Actor, ActorKind


def anonymous(source_ip: str | None) -> Actor:
    """Someone not signed in: a sign-in attempt, a join request, an enrolment attempt.

    A person with no user and no role: every permission check refuses it.
    """
    return Actor(ActorKind.PERSON, source_ip=source_ip)
