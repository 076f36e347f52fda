"""Reading people: roles, and who sees whom."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from accounts.selectors import membership_of, people_visible_to, person_get, role_of
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor, make_person

pytestmark = pytest.mark.django_db


def test_roles(consortium_admin, hospital_admin, observer, no_role_person, hospital_a) -> None:
    assert role_of(consortium_admin) == (Role.CONSORTIUM_ADMIN, None)
    assert role_of(hospital_admin) == (Role.HOSPITAL_ADMIN, hospital_a)
    assert role_of(observer) == (Role.OBSERVER, None)
    assert role_of(no_role_person) == (None, None)


def test_an_inactive_person_has_no_role_but_keeps_their_membership(observer) -> None:
    observer.is_active = False
    assert role_of(observer) == (None, None)
    assert membership_of(observer) == (Role.OBSERVER, None)


def test_a_superuser_without_membership_is_a_consortium_admin(db) -> None:
    root = get_user_model().objects.create_superuser(username="root", password="x" * 20)
    assert role_of(root) == (Role.CONSORTIUM_ADMIN, None)


def test_who_sees_whom(admin_actor, hospital_admin_actor, observer_actor, hospital_b) -> None:
    make_person("hugo", Role.HOSPITAL_ADMIN, hospital_b)
    everyone = {"ada", "hal", "olga", "hugo"}
    assert {p.username for p in people_visible_to(actor=admin_actor)} == everyone
    assert {p.username for p in people_visible_to(actor=observer_actor)} == everyone
    assert {p.username for p in people_visible_to(actor=hospital_admin_actor)} == {"hal"}


def test_no_role_and_agents_see_no_one(no_role_person, hospital_a) -> None:
    for actor in (Actor(ActorKind.PERSON, user=no_role_person), agent_actor(hospital_a)):
        with pytest.raises(PermissionDenied):
            people_visible_to(actor=actor)
        with pytest.raises(PermissionDenied):
            person_get(actor=actor, person_id=no_role_person.pk)


def test_someone_unseen_is_not_found(hospital_admin_actor, observer) -> None:
    with pytest.raises(NotFound):
        person_get(actor=hospital_admin_actor, person_id=observer.pk)
    assert person_get(actor=hospital_admin_actor, person_id=hospital_admin_actor.user.pk)
