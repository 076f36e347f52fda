"""Reads about people and their roles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from accounts.permissions import can_see_person, require_reads_people
from coordinator.actors import Actor, ActorKind, Role
from coordinator.errors import NotFound

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from hospitals.models import Hospital


def role_of(user: AbstractBaseUser) -> tuple[Role | None, Hospital | None]:
    """The role of ``user`` and, for a hospital admin, the hospital.

    Django superusers are consortium admins; a person without a membership has no role
    and may do nothing.
    """
    if not user.is_authenticated or not user.is_active:
        return None, None
    return membership_of(user)


def membership_of(user: AbstractBaseUser) -> tuple[Role | None, Hospital | None]:
    """The role ``user`` holds (active or not) and, for a hospital admin, the hospital."""
    membership = getattr(user, "membership", None)
    if membership is not None:
        return Role(membership.role), membership.hospital
    if user.is_superuser:
        return Role.CONSORTIUM_ADMIN, None
    return None, None


def people_visible_to(*, actor: Actor) -> QuerySet:
    """The people ``actor`` may see, by username.

    Consortium admins and observers see everyone; a hospital admin sees themself and
    the people of their hospital. A person without a role, or an agent, gets 403.
    """
    require_reads_people(actor)
    people = (
        get_user_model()
        .objects.select_related("membership", "membership__hospital")
        .order_by("username", "pk")
    )
    if actor.is_system or actor.is_consortium_admin or actor.role == Role.OBSERVER:
        return people
    if actor.kind == ActorKind.PERSON and actor.hospital is not None:
        own = Q(membership__hospital=actor.hospital)
        if actor.user is not None:
            own |= Q(pk=actor.user.pk)
        return people.filter(own)
    return people.none()


def person_get(*, actor: Actor, person_id: int) -> AbstractBaseUser:
    """One person ``actor`` may see; anyone else is 404."""
    require_reads_people(actor)
    person = (
        get_user_model()
        .objects.select_related("membership", "membership__hospital")
        .filter(pk=person_id)
        .first()
    )
    if person is None or not can_see_person(actor, person):
        raise NotFound("no such person")
    return person
