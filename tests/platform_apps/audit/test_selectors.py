"""The audit log's reads, called directly (the API's tests cover the same rules over HTTP)."""

from __future__ import annotations

import pytest

from audit.selectors import audit_event_list, audit_verify_chain
from audit.services import audit_record
from kernel.actors import Actor, ActorKind
from kernel.errors import InvalidInput, PermissionDenied
from tests.platform_apps.conftest import agent_actor

pytestmark = pytest.mark.django_db


@pytest.fixture
def about_hospitals(system_actor: Actor) -> None:
    for hospital in ("st-marys", "city-general", "st-marys", ""):
        audit_record(actor=system_actor, action="x.y", hospital=hospital)


def ids(events) -> list[int]:
    return list(events.values_list("id", flat=True))


def test_readers_of_the_whole_log(about_hospitals, admin_actor, observer_actor) -> None:
    for actor in (Actor.system(), admin_actor, observer_actor):
        assert ids(audit_event_list(actor=actor)) == [1, 2, 3, 4]
        assert ids(audit_event_list(actor=actor, newest_first=True)) == [4, 3, 2, 1]


def test_a_hospital_admin_reads_their_hospitals_events(
    about_hospitals, hospital_admin_actor
) -> None:
    assert ids(audit_event_list(actor=hospital_admin_actor)) == [1, 3]


def test_agents_and_people_without_a_role_read_nothing(
    about_hospitals, hospital_a, no_role_person
) -> None:
    nobody = Actor(ActorKind.PERSON, user=no_role_person, role=None)
    for actor in (agent_actor(hospital_a), nobody):
        with pytest.raises(PermissionDenied):
            audit_event_list(actor=actor)
        with pytest.raises(PermissionDenied):
            audit_verify_chain(actor=actor)


def test_only_whole_log_readers_check_the_chain(
    about_hospitals, admin_actor, observer_actor, hospital_admin_actor
) -> None:
    assert audit_verify_chain(actor=admin_actor).ok
    assert audit_verify_chain(actor=observer_actor).ok
    with pytest.raises(PermissionDenied, match="consortium admins and observers"):
        audit_verify_chain(actor=hospital_admin_actor)


def test_malformed_filters_are_invalid_input_naming_the_field(admin_actor) -> None:
    with pytest.raises(InvalidInput) as failure:
        audit_event_list(actor=admin_actor, filters={"job": "x", "created_after": "soon"})
    assert set(failure.value.details) == {"job", "created_after"}
    assert all(isinstance(m, str) for ms in failure.value.details.values() for m in ms)
