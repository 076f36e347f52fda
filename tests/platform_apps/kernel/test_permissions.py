"""The permission rules, role by role, in the order that keeps answers from leaking."""

from __future__ import annotations

import pytest

from kernel import permissions
from kernel.actors import Actor, ActorKind
from kernel.errors import NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor

pytestmark = pytest.mark.django_db


def test_a_consortium_admin_manages_any_hospital(admin_actor, hospital_b) -> None:
    permissions.require_manages_hospital(admin_actor, hospital_b, "x")
    permissions.require_consortium_admin_on(admin_actor, hospital_b, "x")


def test_a_hospital_admin_manages_only_their_own(hospital_admin_actor, hospital_a, hospital_b):
    permissions.require_manages_hospital(hospital_admin_actor, hospital_a, "x")
    with pytest.raises(NotFound):
        permissions.require_manages_hospital(hospital_admin_actor, hospital_b, "x")
    with pytest.raises(PermissionDenied):
        permissions.require_consortium_admin_on(hospital_admin_actor, hospital_a, "x")


def test_an_observer_reads_but_never_manages(observer_actor, hospital_b) -> None:
    permissions.require_reads_hospital(observer_actor, hospital_b)
    with pytest.raises(PermissionDenied):
        permissions.require_manages_hospital(observer_actor, hospital_b, "x")


def test_a_person_without_a_role_is_refused_before_anything_is_looked_up(
    no_role_person, hospital_b
) -> None:
    actor = Actor(ActorKind.PERSON, user=no_role_person)
    with pytest.raises(PermissionDenied):  # 403, not 404
        permissions.require_reads_hospital(actor, hospital_b)


def test_an_agent_sees_only_its_hospital_and_only_through_agent_endpoints(
    hospital_a, hospital_b
) -> None:
    agent = agent_actor(hospital_a)
    with pytest.raises(NotFound):
        permissions.require_reads_hospital(agent, hospital_b)
    with pytest.raises(PermissionDenied):
        permissions.require_reads_hospital(agent, hospital_a)
    permissions.require_agent(agent, "x")


def test_people_are_not_agents(admin_actor) -> None:
    with pytest.raises(PermissionDenied):
        permissions.require_agent(admin_actor, "send heartbeats")
    with pytest.raises(PermissionDenied):
        permissions.require_agent(Actor.system(), "send heartbeats")
