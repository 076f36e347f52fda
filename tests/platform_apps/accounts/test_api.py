"""The accounts API: signing in and out, who am I, people; each role's refusals and the
error shape of each answer."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import Membership
from audit.models import AuditEvent
from kernel.actors import Role
from tests.platform_apps.conftest import PASSWORD, make_person
from tests.platform_apps.hospitals.helpers import (
    assert_error,
    assert_not_authenticated,
    throttle_rates,
)

pytestmark = pytest.mark.django_db

STRONG = "a long and unusual passphrase 47"


def sign_in(client: APIClient, username: str, password: str = PASSWORD, **extra):
    return client.post("/api/auth/sign-in/", {"username": username, "password": password}, **extra)


def csrf_token(client: APIClient) -> str:
    """The token the dashboard's page hands out with its csrftoken cookie."""
    client.get("/")
    return client.cookies["csrftoken"].value


# -- signing in and out ------------------------------------------------------------------


def test_sign_in_starts_a_session_and_is_audited(hospital_admin) -> None:
    client = APIClient(enforce_csrf_checks=True)
    response = sign_in(client, "hal", REMOTE_ADDR="10.1.2.3", HTTP_X_CSRFTOKEN=csrf_token(client))
    assert response.status_code == 200, response.content
    assert response.json() == {"username": "hal", "role": "hospital_admin", "hospital": "st-marys"}
    assert client.get("/api/auth/me/").json()["username"] == "hal"
    event = AuditEvent.objects.get(action="auth.signed_in")
    assert event.details == {"username": "hal"}
    assert event.source_ip == "10.1.2.3" and event.hospital == "st-marys"
    assert PASSWORD not in str(event.details)


@pytest.mark.parametrize(
    ("username", "password"),
    [("hal", "wrong password entirely"), ("nobody", PASSWORD)],
)
def test_a_failed_sign_in_is_400_and_audited_without_the_password(
    hospital_admin, username, password
) -> None:
    client = APIClient()
    response = sign_in(client, username, password, REMOTE_ADDR="10.9.9.9")
    assert_error(response, 400, "invalid_credentials")
    assert_not_authenticated(client.get("/api/auth/me/"))
    event = AuditEvent.objects.get(action="auth.sign_in_failed")
    assert event.details == {"username": username, "failures": 1, "next_attempt_after": 0}
    assert event.source_ip == "10.9.9.9"
    assert password not in str(AuditEvent.objects.values())


def test_an_inactive_person_cannot_sign_in(hospital_admin) -> None:
    get_user_model().objects.filter(pk=hospital_admin.pk).update(is_active=False)
    assert_error(sign_in(APIClient(), "hal"), 400, "invalid_credentials")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"username": "hal"}, "password"),
        ({"username": "hal", "password": 123}, "password"),
        ({"username": ["hal"], "password": PASSWORD}, "username"),
        ({"username": "hal", "password": PASSWORD, "remember": True}, "remember"),
    ],
)
def test_sign_in_refuses_bad_input(hospital_admin, payload, field) -> None:
    response = APIClient().post("/api/auth/sign-in/", payload)
    assert field in assert_error(response, 400, "invalid")["details"]
    assert not AuditEvent.objects.filter(action="auth.signed_in").exists()


def test_sign_in_is_throttled(hospital_admin) -> None:
    with throttle_rates("2/minute"):
        client = APIClient()
        for _ in range(2):
            assert_error(sign_in(client, "hal", "wrong password entirely"), 400)
        response = sign_in(client, "hal")  # even the right password, now
    assert_error(response, 429, "throttled")
    assert "Retry-After" in response
    assert not AuditEvent.objects.filter(action="auth.signed_in").exists()


def test_sign_out_ends_the_session(hospital_admin) -> None:
    client = APIClient()
    sign_in(client, "hal")
    response = client.post("/api/auth/sign-out/")
    assert response.status_code == 204
    assert_not_authenticated(client.get("/api/auth/me/"))
    assert AuditEvent.objects.filter(action="auth.signed_out").count() == 1


def test_sign_out_needs_the_csrf_token(hospital_admin) -> None:
    client = APIClient(enforce_csrf_checks=True)
    assert sign_in(client, "hal", HTTP_X_CSRFTOKEN=csrf_token(client)).status_code == 200
    assert_error(client.post("/api/auth/sign-out/"), 403, "permission_denied")
    assert client.get("/api/auth/me/").status_code == 200  # still signed in
    token = client.cookies["csrftoken"].value
    assert client.post("/api/auth/sign-out/", HTTP_X_CSRFTOKEN=token).status_code == 204


def test_sign_out_needs_a_session(db) -> None:
    assert_not_authenticated(APIClient().post("/api/auth/sign-out/"))


def test_agents_do_not_sign_out(client_as) -> None:
    assert_error(client_as("agent_a").post("/api/auth/sign-out/"), 403, "permission_denied")


def test_a_person_without_a_role_may_sign_out(client_as) -> None:
    assert client_as("no_role_person").post("/api/auth/sign-out/").status_code == 204


# -- who am I ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "expected"),
    [
        ("consortium_admin", {"username": "ada", "role": "consortium_admin", "hospital": None}),
        ("hospital_admin", {"username": "hal", "role": "hospital_admin", "hospital": "st-marys"}),
        ("observer", {"username": "olga", "role": "observer", "hospital": None}),
        ("no_role_person", {"username": "nora", "role": None, "hospital": None}),
    ],
)
def test_me_says_who_you_are(client_as, who, expected) -> None:
    response = client_as(who).get("/api/auth/me/")
    assert response.status_code == 200
    assert response.json() == expected


def test_me_is_not_for_agents(client_as) -> None:
    assert_error(client_as("agent_a").get("/api/auth/me/"), 403, "permission_denied")


def test_me_needs_a_session(db) -> None:
    assert_not_authenticated(APIClient().get("/api/auth/me/"))


# -- people ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["consortium_admin", "observer"])
def test_admins_and_observers_see_everyone(
    client_as, consortium_admin, hospital_admin, observer, no_role_person, who
) -> None:
    response = client_as(who).get("/api/people/")
    assert response.status_code == 200
    body = response.json()
    assert [p["username"] for p in body["results"]] == ["ada", "hal", "nora", "olga"]
    hal = body["results"][1]
    assert set(hal) == {
        "id",
        "username",
        "email",
        "role",
        "hospital",
        "is_active",
        "date_joined",
        "last_login",
    }
    assert (hal["role"], hal["hospital"]) == ("hospital_admin", "st-marys")
    assert "password" not in str(body)


def test_a_hospital_admin_sees_only_their_hospitals_people(
    client_as, consortium_admin, hospital_admin, hospital_a, hospital_b, observer
) -> None:
    make_person("hana", Role.HOSPITAL_ADMIN, hospital_a)
    make_person("hugo", Role.HOSPITAL_ADMIN, hospital_b)
    body = client_as("hospital_admin").get("/api/people/").json()
    assert [p["username"] for p in body["results"]] == ["hal", "hana"]


@pytest.mark.parametrize("who", ["no_role_person", "agent_a"])
def test_no_role_and_agents_see_no_people(client_as, who) -> None:
    assert_error(client_as(who).get("/api/people/"), 403, "permission_denied")


def test_people_need_a_session(db) -> None:
    assert_not_authenticated(APIClient().get("/api/people/"))


def test_an_admin_adds_a_hospital_admin(client_as, hospital_a) -> None:
    response = client_as("consortium_admin").post(
        "/api/people/",
        {"username": "hank", "password": STRONG, "role": "hospital_admin", "hospital": "st-marys"},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["username"], body["role"], body["hospital"]) == (
        "hank",
        "hospital_admin",
        "st-marys",
    )
    assert sign_in(APIClient(), "hank", STRONG).status_code == 200
    event = AuditEvent.objects.get(action="person.created")
    assert event.hospital == "st-marys" and event.details["role"] == "hospital_admin"
    assert STRONG not in str(event.details)


def test_an_admin_adds_an_observer(client_as) -> None:
    response = client_as("consortium_admin").post(
        "/api/people/", {"username": "otto", "password": STRONG, "role": "observer"}
    )
    assert response.status_code == 201
    assert Membership.objects.get(user__username="otto").role == "observer"


@pytest.mark.parametrize("who", ["hospital_admin", "observer", "no_role_person", "agent_a"])
def test_only_consortium_admins_add_people(client_as, who) -> None:
    response = client_as(who).post(
        "/api/people/", {"username": "mallory", "password": STRONG, "role": "consortium_admin"}
    )
    assert_error(response, 403, "permission_denied")
    assert not get_user_model().objects.filter(username="mallory").exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"username": "pat", "password": "short", "role": "observer"}, "password"),
        ({"username": "pat", "password": "password1234", "role": "observer"}, "password"),
        (
            {"username": "patrick.jones.md", "password": "patrick.jones.md1", "role": "observer"},
            "password",
        ),
        ({"username": "hal", "password": STRONG, "role": "observer"}, "username"),
        ({"username": "HAL", "password": STRONG, "role": "observer"}, "username"),
        ({"username": "p a t", "password": STRONG, "role": "observer"}, "username"),
        ({"username": "pat", "password": STRONG, "role": "king"}, "role"),
        ({"username": "pat", "password": STRONG, "role": "hospital_admin"}, "hospital"),
        (
            {"username": "pat", "password": STRONG, "role": "hospital_admin", "hospital": "nope"},
            "hospital",
        ),
        (
            {"username": "pat", "password": STRONG, "role": "observer", "hospital": "st-marys"},
            "hospital",
        ),
        ({"username": "pat", "password": STRONG, "role": "observer", "admin": True}, "admin"),
        ({"username": 7, "password": STRONG, "role": "observer"}, "username"),
        ({"password": STRONG, "role": "observer"}, "username"),
    ],
)
def test_adding_a_person_refuses_bad_input(client_as, hospital_admin, payload, field) -> None:
    admin = client_as("consortium_admin")
    before = get_user_model().objects.count()
    body = assert_error(admin.post("/api/people/", payload), 400, "invalid")
    assert field in body["details"], body
    assert get_user_model().objects.count() == before


def test_an_admin_changes_a_role(client_as, hospital_admin, hospital_b) -> None:
    response = client_as("consortium_admin").patch(
        f"/api/people/{hospital_admin.pk}/", {"hospital": "city-general"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["hospital"] == "city-general"
    response = client_as("consortium_admin").patch(
        f"/api/people/{hospital_admin.pk}/", {"role": "observer"}
    )
    assert (response.json()["role"], response.json()["hospital"]) == ("observer", None)
    changes = [e.details["changes"] for e in AuditEvent.objects.filter(action="person.updated")]
    assert changes == [
        {"hospital": ["st-marys", "city-general"]},
        {"role": ["hospital_admin", "observer"], "hospital": ["city-general", None]},
    ]


def test_taking_the_role_away_leaves_a_person_with_nothing(client_as, observer) -> None:
    olga = client_as("observer")
    assert olga.get("/api/hospitals/").status_code == 200
    response = client_as("consortium_admin").patch(f"/api/people/{observer.pk}/", {"role": None})
    assert response.status_code == 200 and response.json()["role"] is None
    assert_error(olga.get("/api/hospitals/"), 403, "permission_denied")


def test_deactivation_ends_access_at_the_next_request(client_as, observer) -> None:
    olga = client_as("observer")
    assert olga.get("/api/auth/me/").status_code == 200
    response = client_as("consortium_admin").patch(
        f"/api/people/{observer.pk}/", {"is_active": False}
    )
    assert response.status_code == 200 and response.json()["is_active"] is False
    assert_not_authenticated(olga.get("/api/auth/me/"))


def test_an_admin_cannot_demote_or_deactivate_themself(client_as, consortium_admin) -> None:
    admin = client_as("consortium_admin")
    for change in ({"role": "observer"}, {"is_active": False}, {"role": None}):
        response = admin.patch(f"/api/people/{consortium_admin.pk}/", change)
        assert_error(response, 409, "conflict")
    assert Membership.objects.get(user=consortium_admin).role == "consortium_admin"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"role": "hospital_admin"}, "hospital"),  # an observer becoming one needs a hospital
        ({"hospital": "nope"}, "hospital"),
        ({"is_active": "no"}, "is_active"),
        ({"password": STRONG}, "password"),  # not changed here
        ({"username": "olga2"}, "username"),
    ],
)
def test_changing_a_person_refuses_bad_input(client_as, observer, payload, field) -> None:
    response = client_as("consortium_admin").patch(f"/api/people/{observer.pk}/", payload)
    assert field in assert_error(response, 400, "invalid")["details"]
    assert Membership.objects.get(user=observer).role == "observer"


@pytest.mark.parametrize(
    ("who", "target", "status"),
    [
        ("hospital_admin", "colleague", 403),  # sees them, may not change them
        ("hospital_admin", "stranger", 404),  # another hospital's person
        ("hospital_admin", "observer", 404),
        ("observer", "colleague", 403),
        ("no_role_person", "colleague", 403),
        ("agent_a", "colleague", 403),
        ("consortium_admin", "ghost", 404),
    ],
)
def test_who_may_not_change_people(
    client_as, hospital_a, hospital_b, hospital_admin, observer, who, target, status
) -> None:
    people = {
        "colleague": make_person("hana", Role.HOSPITAL_ADMIN, hospital_a).pk,
        "stranger": make_person("hugo", Role.HOSPITAL_ADMIN, hospital_b).pk,
        "observer": observer.pk,
        "ghost": 999_999,
    }
    response = client_as(who).patch(f"/api/people/{people[target]}/", {"role": "consortium_admin"})
    assert_error(response, status)
    assert not Membership.objects.filter(role="consortium_admin").exclude(user__username="ada")


@pytest.mark.parametrize(
    ("who", "target", "status"),
    [
        ("consortium_admin", "stranger", 200),
        ("observer", "stranger", 200),
        ("hospital_admin", "colleague", 200),
        ("hospital_admin", "stranger", 404),
        ("no_role_person", "colleague", 403),
        ("agent_a", "colleague", 403),
    ],
)
def test_who_may_see_one_person(client_as, hospital_a, hospital_b, who, target, status) -> None:
    people = {
        "colleague": make_person("hana", Role.HOSPITAL_ADMIN, hospital_a).pk,
        "stranger": make_person("hugo", Role.HOSPITAL_ADMIN, hospital_b).pk,
    }
    response = client_as(who).get(f"/api/people/{people[target]}/")
    if status == 200:
        assert response.status_code == 200 and response.json()["id"] == people[target]
    else:
        assert_error(response, status)
