"""Reads about people and their roles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from kernel.actors import Actor, ActorKind, Role, membership_of, role_of
from kernel.errors import NotFound
from kernel.permissions import can_see_person, require_reads_people

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

__all__ = ["membership_of", "people_visible_to", "person_get", "role_of"]


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
