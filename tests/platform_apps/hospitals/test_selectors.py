"""Reading hospitals: who sees which, and when a hospital is online."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from hospitals import selectors
from hospitals.models import Hospital
from kernel.actors import Actor, ActorKind
from kernel.errors import InvalidInput, NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor

pytestmark = pytest.mark.django_db


def test_online_is_a_window_after_the_last_heartbeat(hospital_a) -> None:
    now = timezone.now()
    window = timedelta(seconds=settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"])
    assert not selectors.hospital_is_online(hospital=hospital_a, now=now)  # never seen
    hospital_a.last_seen_at = now - window
    assert selectors.hospital_is_online(hospital=hospital_a, now=now)
    hospital_a.last_seen_at = now - window - timedelta(seconds=1)
    assert not selectors.hospital_is_online(hospital=hospital_a, now=now)


def test_the_window_follows_the_setting(hospital_a, settings) -> None:
    hospital_a.last_seen_at = timezone.now() - timedelta(seconds=30)
    settings.MEDSPLIT = {**settings.MEDSPLIT, "HOSPITAL_OFFLINE_AFTER_SECONDS": 60}
    assert selectors.hospital_is_online(hospital=hospital_a)
    settings.MEDSPLIT = {**settings.MEDSPLIT, "HOSPITAL_OFFLINE_AFTER_SECONDS": 10}
    assert not selectors.hospital_is_online(hospital=hospital_a)


def test_the_list_and_the_flag_agree(admin_actor, hospital_a, hospital_b) -> None:
    window = settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"]
    Hospital.objects.filter(pk=hospital_a.pk).update(last_seen_at=timezone.now())
    Hospital.objects.filter(pk=hospital_b.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=window + 1)
    )
    listed = {h.slug: h.online for h in selectors.hospital_list(actor=admin_actor)}
    assert listed == {"st-marys": True, "city-general": False}


def test_a_hospital_admin_sees_only_their_hospital(hospital_admin_actor, hospital_b) -> None:
    assert [h.slug for h in selectors.hospital_list(actor=hospital_admin_actor)] == ["st-marys"]
    with pytest.raises(NotFound):
        selectors.hospital_get(actor=hospital_admin_actor, slug="city-general")


def test_a_person_without_a_role_sees_nothing(no_role_person, hospital_a) -> None:
    actor = Actor(ActorKind.PERSON, user=no_role_person)
    with pytest.raises(PermissionDenied):
        selectors.hospital_list(actor=actor)
    with pytest.raises(PermissionDenied):
        selectors.hospital_get(actor=actor, slug="st-marys")


def test_agents_use_their_own_endpoints(hospital_a, hospital_b) -> None:
    with pytest.raises(PermissionDenied):
        selectors.hospital_list(actor=agent_actor(hospital_a))
    with pytest.raises(NotFound):
        selectors.hospital_get(actor=agent_actor(hospital_a), slug="city-general")
    assert selectors.agent_hospital(actor=agent_actor(hospital_a)).slug == "st-marys"


def test_bad_filters_are_invalid_input(admin_actor, hospital_a) -> None:
    with pytest.raises(InvalidInput) as caught:
        selectors.hospital_list(actor=admin_actor, filters={"online": "maybe"})
    assert "online" in caught.value.details
