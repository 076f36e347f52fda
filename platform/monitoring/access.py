"""Who may read ``GET /metrics``: a scraper holding ``MEDSPLIT_METRICS_TOKEN``, or a
signed-in consortium admin. Counts of jobs and hospitals are not public."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from kernel import secrets
from kernel.actors import actor_from_request
from kernel.api.bearer import KEYWORD, bearer_token
from kernel.errors import PermissionDenied


@dataclass(frozen=True)
class MetricsScraper:
    """``request.user`` for a caller that presented the metrics token: not a person."""

    is_authenticated: bool = True
    is_active: bool = True
    is_superuser: bool = False
    is_staff: bool = False
    pk: None = None

    def get_username(self) -> str:
        return "metrics-scraper"


class MetricsTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <MEDSPLIT_METRICS_TOKEN>``, compared in constant time."""

    keyword = KEYWORD

    def authenticate(self, request: Request) -> tuple[MetricsScraper, None] | None:
        token = bearer_token(request)
        if token is None:
            return None  # no token: a signed-in admin's session may apply
        configured = settings.MEDSPLIT["METRICS_TOKEN"]
        if not configured:
            raise exceptions.AuthenticationFailed(
                "this coordinator has no metrics token (MEDSPLIT_METRICS_TOKEN is not set); "
                "sign in as a consortium admin instead"
            )
        presented = token.decode("utf-8", errors="replace")
        # Both sides hashed first: the comparison takes the same time whatever the
        # presented token's length or content.
        if not secrets.matches(presented, secrets.digest_of(configured)):
            raise exceptions.AuthenticationFailed("invalid metrics token")
        return MetricsScraper(), None

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class ScraperOrConsortiumAdmin(permissions.BasePermission):
    """The metrics token, or a consortium admin's session; nobody else."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if isinstance(request.user, MetricsScraper):
            return True
        if not request.user or not request.user.is_authenticated:
            return False  # DRF answers 401 with WWW-Authenticate: Bearer
        if actor_from_request(request).is_consortium_admin:
            return True
        raise PermissionDenied(
            "only a consortium admin, or a scraper with the metrics token, may read the metrics"
        )
