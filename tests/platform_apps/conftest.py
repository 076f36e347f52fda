"""Shared fixtures for the coordinator's tests: people in each role, hospitals, agents."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import Membership
from hospitals.authentication import TOKEN_PREFIX
from hospitals.models import AgentToken, Hospital
from kernel import secrets
from kernel.actors import Actor, ActorKind, Role
from tests.platform_apps.audit.support import flush_past_audit_triggers

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True, scope="session")
def _flushable_audit_log() -> Iterator[None]:
    """Transactional tests end with a TRUNCATE that PostgreSQL's audit triggers refuse."""
    with flush_past_audit_triggers():
        yield


@pytest.fixture
def needs_postgres() -> None:
    """Row locks are what some tests test: SQLite serialises whole transactions."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent calls need PostgreSQL's row locks: set DATABASE_URL=postgres://...")


@pytest.fixture(autouse=True)
def _fast_passwords(settings) -> None:
    """People are made with passwords; the production hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_hospital(slug: str, **fields: object) -> Hospital:
    defaults = {"name": slug.replace("-", " ").title(), "status": Hospital.Status.ENROLLED}
    return Hospital.objects.create(slug=slug, **{**defaults, **fields})


def make_person(username: str, role: Role | None, hospital: Hospital | None = None):
    user = get_user_model().objects.create_user(username=username, password=PASSWORD)
    if role is not None:
        Membership.objects.create(user=user, role=role.value, hospital=hospital)
    return user


@pytest.fixture
def hospital_a(db: None) -> Hospital:
    return make_hospital("st-marys")


@pytest.fixture
def hospital_b(db: None) -> Hospital:
    return make_hospital("city-general")


@pytest.fixture
def consortium_admin(db: None):
    return make_person("ada", Role.CONSORTIUM_ADMIN)


@pytest.fixture
def hospital_admin(hospital_a: Hospital):
    """Admin of hospital A only."""
    return make_person("hal", Role.HOSPITAL_ADMIN, hospital_a)


@pytest.fixture
def observer(db: None):
    return make_person("olga", Role.OBSERVER)


@pytest.fixture
def no_role_person(db: None):
    return make_person("nora", None)


@pytest.fixture
def client_for() -> Callable[..., APIClient]:
    """An API client signed in as ``user`` (a session, like the dashboard's)."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_login(user)
        return client

    return make


def issue_agent_token(hospital: Hospital) -> str:
    """A fresh agent token for ``hospital``, returned in plain text."""
    issued = secrets.issue(TOKEN_PREFIX)
    AgentToken.objects.create(hospital=hospital, key_id=issued.key_id, digest=issued.digest)
    return issued.plaintext


@pytest.fixture
def agent_client() -> Callable[[Hospital], APIClient]:
    """An API client authenticated as ``hospital``'s agent (bearer token)."""

    def make(hospital: Hospital) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_agent_token(hospital)}")
        return client

    return make


def person_actor(user, role: Role, hospital: Hospital | None = None) -> Actor:
    return Actor(ActorKind.PERSON, user=user, role=role, hospital=hospital, source_ip="127.0.0.1")


@pytest.fixture
def admin_actor(consortium_admin) -> Actor:
    return person_actor(consortium_admin, Role.CONSORTIUM_ADMIN)


@pytest.fixture
def hospital_admin_actor(hospital_admin, hospital_a: Hospital) -> Actor:
    return person_actor(hospital_admin, Role.HOSPITAL_ADMIN, hospital_a)


@pytest.fixture
def observer_actor(observer) -> Actor:
    return person_actor(observer, Role.OBSERVER)


def agent_actor(hospital: Hospital) -> Actor:
    return Actor(ActorKind.HOSPITAL, hospital=hospital, source_ip="127.0.0.1")
