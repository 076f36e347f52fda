"""People services called directly, as the admin, commands and tasks would."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from accounts import services
from accounts.models import Membership
from audit.models import AuditEvent
from kernel.actors import Actor, Role
from kernel.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor, make_person

pytestmark = pytest.mark.django_db

STRONG = "a long and unusual passphrase 47"


def test_the_system_may_create_people(hospital_a) -> None:
    person = services.person_create(
        actor=Actor.system(),
        username="hank",
        password=STRONG,
        role=Role.HOSPITAL_ADMIN,
        hospital_slug="st-marys",
    )
    assert person.check_password(STRONG)
    assert Membership.objects.get(user=person).hospital == hospital_a


def test_a_refused_creation_changes_nothing(admin_actor) -> None:
    with pytest.raises(InvalidInput) as caught:
        services.person_create(
            actor=admin_actor, username="x y", password="short", role=Role.HOSPITAL_ADMIN
        )
    assert set(caught.value.details) == {"username", "password", "hospital"}
    assert get_user_model().objects.count() == 1
    assert not AuditEvent.objects.filter(action="person.created").exists()


@pytest.mark.parametrize("actor_name", ["hospital_admin_actor", "observer_actor"])
def test_only_consortium_admins_create_people(request, actor_name) -> None:
    with pytest.raises(PermissionDenied):
        services.person_create(
            actor=request.getfixturevalue(actor_name),
            username="x",
            password=STRONG,
            role=Role.OBSERVER,
        )


def test_agents_create_no_one(hospital_a) -> None:
    with pytest.raises(PermissionDenied):
        services.person_create(
            actor=agent_actor(hospital_a), username="x", password=STRONG, role=Role.OBSERVER
        )


def test_an_update_leaves_unnamed_fields_alone(admin_actor, hospital_admin) -> None:
    person = services.person_update(actor=admin_actor, person=hospital_admin, is_active=False)
    assert not person.is_active
    membership = Membership.objects.get(user=hospital_admin)
    assert (membership.role, membership.hospital.slug) == ("hospital_admin", "st-marys")


def test_an_update_without_changes_is_not_audited(admin_actor, observer) -> None:
    services.person_update(actor=admin_actor, person=observer, role=Role.OBSERVER)
    assert not AuditEvent.objects.filter(action="person.updated").exists()


def test_a_superuser_keeps_their_admin_role(admin_actor) -> None:
    root = get_user_model().objects.create_superuser(username="root", password=STRONG)
    with pytest.raises(InvalidInput) as caught:
        services.person_update(actor=admin_actor, person=root, role=None)
    assert "role" in caught.value.details


def test_updating_someone_unseen_is_404(hospital_admin_actor, hospital_b) -> None:
    stranger = make_person("hugo", Role.HOSPITAL_ADMIN, hospital_b)
    with pytest.raises(NotFound):
        services.person_update(actor=hospital_admin_actor, person=stranger, role=Role.OBSERVER)


def test_an_admin_keeps_their_own_role(admin_actor, consortium_admin) -> None:
    with pytest.raises(Conflict):
        services.person_update(actor=admin_actor, person=consortium_admin, is_active=False)
    assert get_user_model().objects.get(pk=consortium_admin.pk).is_active
