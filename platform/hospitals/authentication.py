"""Agent authentication: ``Authorization: Bearer msa_<key id>_<secret>``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from hospitals.models import AgentToken, Hospital
from kernel import secrets
from kernel.api.bearer import KEYWORD, bearer_token

TOKEN_PREFIX = "msa"
#: How stale a token's ``last_used_at`` may get: writing it at every request put a
#: database write on each of an agent's polls, heartbeats and records.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class AgentPrincipal:
    """``request.user`` for an agent: authenticated, but not a person."""

    hospital: Hospital
    is_authenticated: bool = True
    is_active: bool = True
    is_superuser: bool = False
    is_staff: bool = False
    pk: None = None

    def get_username(self) -> str:
        return f"agent:{self.hospital.slug}"


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """Looks the token up by key id and compares its hash in constant time.

    A revoked token fails on the next request: nothing is cached. Its ``last_used_at``
    is kept to the minute (:data:`LAST_USED_RESOLUTION`).
    """

    keyword = KEYWORD

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, AgentToken] | None:
        presented = bearer_token(request)
        if presented is None:
            return None  # not ours: session authentication may apply
        try:
            plaintext = presented.decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("malformed agent token") from None
        parts = secrets.split(plaintext, TOKEN_PREFIX)
        if parts is None:
            raise exceptions.AuthenticationFailed("malformed agent token")
        key_id, random_part = parts
        token = AgentToken.objects.select_related("hospital").filter(key_id=key_id).first()
        if token is None or not secrets.matches(random_part, token.digest):
            raise exceptions.AuthenticationFailed("invalid agent token")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("this agent token was revoked")
        if token.hospital.status == Hospital.Status.SUSPENDED:
            raise exceptions.AuthenticationFailed("this hospital is suspended")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return AgentPrincipal(token.hospital), token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
