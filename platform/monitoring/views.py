"""``GET /metrics``: the consortium's metrics in Prometheus' text format (or OpenMetrics,
when the scraper asks for it)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client.exposition import choose_encoder
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from monitoring.access import MetricsTokenAuthentication, ScraperOrConsortiumAdmin
from monitoring.collectors import consortium_registry


class _JsonErrors(BaseContentNegotiation):
    """Errors always in the project's JSON shape, whatever ``Accept`` says: scrapers ask
    for text formats, and a 406 would hide why they were refused."""

    def select_renderer(
        self, request: Request, renderers: list[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        return renderers[0], renderers[0].media_type

    def select_parser(self, request: Request, parsers: list) -> None:
        return None


@extend_schema(exclude=True)  # not part of the JSON API: text for Prometheus
class MetricsView(APIView):
    """The metrics, computed now from the database and the broker."""

    authentication_classes = [
        MetricsTokenAuthentication,
        # A consortium admin's dashboard session (GET only: no CSRF needed).
        SessionAuthentication,
    ]
    permission_classes = [ScraperOrConsortiumAdmin]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _JsonErrors

    def get(self, request: Request) -> HttpResponse:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        response = HttpResponse(encoder(consortium_registry()), content_type=content_type)
        response["Cache-Control"] = "no-store"
        return response
