"""The permission rules every service applies to its actor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.actors import Actor, ActorKind, Role
from coordinator.errors import NotFound, PermissionDenied

if TYPE_CHECKING:
    from hospitals.models import Hospital


def require_consortium_admin(actor: Actor, action: str) -> None:
    """Only a consortium admin (or the system) may ``action``."""
    if actor.is_system or actor.is_consortium_admin:
        return
    raise PermissionDenied(f"only a consortium admin may {action}")


def require_person_with_role(actor: Actor) -> None:
    """Any signed-in person with a role (observers included)."""
    if actor.kind == ActorKind.PERSON and actor.role is None:
        raise PermissionDenied("your account has no role in this consortium; ask an admin")


def can_see_hospital(actor: Actor, hospital: Hospital) -> bool:
    """Consortium admins and observers see every hospital; others only their own."""
    if actor.is_system or actor.is_consortium_admin:
        return True
    if actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER:
        return True
    return actor.hospital is not None and actor.hospital.pk == hospital.pk


def require_sees_hospital(actor: Actor, hospital: Hospital) -> None:
    """A hospital the actor may not see does not exist for it (404, not 403)."""
    if not can_see_hospital(actor, hospital):
        raise NotFound("no such hospital")


def can_manage_hospital(actor: Actor, hospital: Hospital) -> bool:
    """Consortium admins manage every hospital, a hospital admin their own."""
    if actor.is_system or actor.is_consortium_admin:
        return True
    return (
        actor.kind == ActorKind.PERSON
        and actor.role == Role.HOSPITAL_ADMIN
        and actor.hospital is not None
        and actor.hospital.pk == hospital.pk
    )


def require_writer(actor: Actor) -> None:
    """Observers are read-only."""
    if actor.kind == ActorKind.PERSON and actor.role in (None, Role.OBSERVER):
        raise PermissionDenied("observers have read-only access")
