"""Who is acting: a person (with a role), a hospital's agent, or the system itself.

Services take an :class:`Actor` and enforce permissions themselves, so every interface
(API, admin, commands, tasks) is held to the same rules.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from rest_framework.settings import api_settings

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.http import HttpRequest
    from rest_framework.request import Request


class Hospital(Protocol):
    """What the kernel needs of a hospital (``hospitals.models.Hospital`` is one): the
    kernel imports no app, so it names the attributes it reads instead of the model."""

    pk: Any
    slug: str


class ActorKind(StrEnum):
    PERSON = "person"
    HOSPITAL = "hospital"
    SYSTEM = "system"


class Role(StrEnum):
    """What a person may do. ``HOSPITAL_ADMIN`` is bound to one hospital."""

    CONSORTIUM_ADMIN = "consortium_admin"
    HOSPITAL_ADMIN = "hospital_admin"
    OBSERVER = "observer"


@dataclass(frozen=True)
class Actor:
    """The party behind a call.

    Attributes:
        kind: person, hospital (its agent) or system (scheduler, commands).
        user: the person, for ``PERSON``.
        role: the person's role, for ``PERSON``.
        hospital: the hospital of a hospital admin, or the hospital whose agent acts.
        source_ip: where the request came from, for the audit log.
    """

    kind: ActorKind
    user: AbstractBaseUser | None = None
    role: Role | None = None
    hospital: Hospital | None = None
    source_ip: str | None = None

    @classmethod
    def system(cls) -> Actor:
        """The coordinator itself: the scheduler, management commands, migrations."""
        return cls(ActorKind.SYSTEM)

    @classmethod
    def anonymous(cls, source_ip: str | None) -> Actor:
        """Someone not signed in (a sign-in attempt, a join request, an enrolment):
        a person with no user and no role, whom every permission check refuses."""
        return cls(ActorKind.PERSON, source_ip=source_ip)

    @property
    def is_consortium_admin(self) -> bool:
        return self.kind == ActorKind.PERSON and self.role == Role.CONSORTIUM_ADMIN

    @property
    def is_system(self) -> bool:
        return self.kind == ActorKind.SYSTEM

    @property
    def label(self) -> str:
        """How the audit log names this actor."""
        if self.kind == ActorKind.PERSON and self.user is not None:
            return f"person:{self.user.get_username()}"
        if self.kind == ActorKind.HOSPITAL and self.hospital is not None:
            return f"hospital:{self.hospital.slug}"
        if self.kind == ActorKind.PERSON:
            return "anonymous"  # not signed in: a failed sign-in, a join request
        return "system"


def client_ip(request: HttpRequest | Request) -> str | None:
    """The address of the client behind ``request``: what every throttle keys on and the
    audit log records as ``source_ip``.

    With no trusted proxy (``MEDSPLIT_TRUSTED_PROXIES=0``, DRF's ``NUM_PROXIES``) it is
    the peer address, and ``X-Forwarded-For`` is ignored. Behind ``n`` proxies, each of
    which appends (or, the first, overwrites with) the address it was reached from, it is
    the ``n``-th address from the right: the one the outermost trusted proxy saw, which
    no client can choose. Anything there that is not an IP address (a proxy that was not
    configured as docs/deploy.md says) falls back to the peer address.
    """
    peer = request.META.get("REMOTE_ADDR")
    proxies = api_settings.NUM_PROXIES or 0
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if proxies <= 0 or not forwarded:
        return peer
    hops = [hop.strip() for hop in forwarded.split(",")]
    candidate = hops[-min(proxies, len(hops))]
    try:
        address = ipaddress.ip_address(candidate)
    except ValueError:
        return peer
    if getattr(address, "scope_id", None):
        return peer  # a zone is a local detail, never a client's address
    return str(address)


def role_of(user: AbstractBaseUser) -> tuple[Role | None, Hospital | None]:
    """The role of ``user`` and, for a hospital admin, the hospital.

    Django superusers are consortium admins; a person without a membership has no role
    and may do nothing. Inactive people have no role.
    """
    if not user.is_authenticated or not user.is_active:
        return None, None
    return membership_of(user)


def membership_of(user: AbstractBaseUser) -> tuple[Role | None, Hospital | None]:
    """The role ``user`` holds (active or not) and, for a hospital admin, the hospital.

    Read from the user's ``membership`` (``accounts.models.Membership``, reached through
    its reverse relation, so the kernel need not import the app).
    """
    membership = getattr(user, "membership", None)
    if membership is not None:
        return Role(membership.role), membership.hospital
    if user.is_superuser:
        return Role.CONSORTIUM_ADMIN, None
    return None, None


def actor_from_request(request: Request) -> Actor:
    """The actor of an authenticated API request (a person's session or an agent token)."""
    ip = client_ip(request)
    agent = getattr(request, "auth", None)
    hospital = getattr(agent, "hospital", None)
    if hospital is not None:
        return Actor(ActorKind.HOSPITAL, hospital=hospital, source_ip=ip)
    user = request.user
    role, member_of = role_of(user)
    return Actor(ActorKind.PERSON, user=user, role=role, hospital=member_of, source_ip=ip)
