"""The permission rules every service and selector applies to its actor.

Who may do what:

- a consortium admin (and the system): everything;
- a hospital admin: read and manage their own hospital (its enrolment codes, its
  tokens, its heartbeat and dataset summary); see the people of their hospital;
- an observer: read everything (hospitals, people), change nothing;
- a signed-in person without a role: nothing (403);
- a hospital's agent (bearer token): only its own hospital's agent endpoints.

Checks run in a fixed order so that the answers do not leak: a person without a role is
refused first (403); then an object the actor may not see does not exist for it (404,
never 403: a hospital admin or an agent cannot tell another hospital's objects from
missing ones); then an action the actor may not take on an object it sees is refused
(403).

Least privilege: what each party sees of the others in a job. One rule, which every
selector and serializer applies (:func:`sees_participant_in_full`) and every later
feature follows:

- consortium admins, observers and the system see every job in full;
- a hospital admin sees the jobs their hospital takes part in: the job itself
  (configuration, state, order) and their own hospital's part in full (its turns with
  their counters, times, losses, metrics and failure reasons, its metric points). Of each
  other participant they see its **name, its position, and its turns' states and sample
  counts, and nothing else**: not its steps, bytes, times, losses, metrics, metric
  points, feature set or failure reasons, nor a job state reason that tells another
  hospital's failure (they see which turn failed, not why). Totals cover the turns they
  see in full. Of a completed job's evaluation (its results) they see their own
  hospital's figures and test size, each other participant's evaluation status only,
  and the figures' mean across hospitals weighted by test size (without the total);
- a hospital's agent sees its own assignments, its own turns and its own failure
  reasons; of the other participants only what handing weights on needs (slug, position,
  public key, whose sealed weights to start from);
- anything new about a participant is shown to the other hospitals only once it is
  added to the list above: hiding is the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel.actors import Actor, ActorKind, Hospital, Role
from kernel.errors import NotFound, PermissionDenied

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


def require_consortium_admin(actor: Actor, action: str) -> None:
    """Only a consortium admin (or the system) may ``action``."""
    if actor.is_system or actor.is_consortium_admin:
        return
    raise PermissionDenied(f"only a consortium admin may {action}")


def require_person_with_role(actor: Actor) -> None:
    """Any signed-in person with a role (observers included)."""
    if actor.kind == ActorKind.PERSON and actor.role is None:
        raise PermissionDenied("your account has no role in this consortium; ask an admin")


def require_person(actor: Actor) -> None:
    """Agents may call only the agent endpoints; everything else is for people."""
    if actor.kind == ActorKind.HOSPITAL:
        raise PermissionDenied("an agent token may call only the agent endpoints (/api/agent/)")


def require_agent(actor: Actor, action: str) -> None:
    """Only a hospital's agent (its bearer token) may ``action``."""
    if actor.kind != ActorKind.HOSPITAL or actor.hospital is None:
        raise PermissionDenied(f"only a hospital's agent may {action}")


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


def require_reads_hospital(actor: Actor, hospital: Hospital) -> None:
    """A person with a role who may see ``hospital`` (403 without a role, else 404)."""
    require_person_with_role(actor)
    require_sees_hospital(actor, hospital)
    require_person(actor)


def require_manages_hospital(actor: Actor, hospital: Hospital, action: str) -> None:
    """A consortium admin, or ``hospital``'s own admin, may ``action`` on it."""
    require_reads_hospital(actor, hospital)
    if not can_manage_hospital(actor, hospital):
        raise PermissionDenied(f"only a consortium admin or this hospital's admin may {action}")


def require_consortium_admin_on(actor: Actor, hospital: Hospital, action: str) -> None:
    """Only a consortium admin may ``action`` on ``hospital`` (others: 403 or 404)."""
    require_reads_hospital(actor, hospital)
    require_consortium_admin(actor, action)


def require_reads_people(actor: Actor) -> None:
    """Lists of people are for people with a role (and the system), never for agents."""
    require_person_with_role(actor)
    require_person(actor)


def sees_participant_in_full(actor: Actor, hospital_id: object) -> bool:
    """Whether ``actor`` sees everything about the part the hospital ``hospital_id`` has
    in a job ``actor`` may see (the least-privilege rule above): consortium admins,
    observers and the system for every hospital, a hospital admin or agent for its own."""
    if actor.is_system or actor.is_consortium_admin:
        return True
    if actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER:
        return True
    return actor.hospital is not None and actor.hospital.pk == hospital_id


def can_see_person(actor: Actor, user: AbstractBaseUser) -> bool:
    """Consortium admins and observers see everyone; a hospital admin sees themself and
    the people of their hospital."""
    if actor.is_system or actor.is_consortium_admin:
        return True
    if actor.kind != ActorKind.PERSON or actor.role is None:
        return False
    if actor.role == Role.OBSERVER:
        return True
    if actor.user is not None and actor.user.pk == user.pk:
        return True
    membership = getattr(user, "membership", None)
    return (
        actor.hospital is not None
        and membership is not None
        and membership.hospital_id == actor.hospital.pk
    )
