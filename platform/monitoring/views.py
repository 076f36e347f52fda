"""``GET /metrics``: the consortium's metrics in Prometheus' text format (or OpenMetrics,
when the scraper asks for it)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client.exposition import choose_encoder
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.actors import actor_from_request
from kernel.permissions import require_person_with_role
from monitoring.access import MetricsTokenAuthentication, ScraperOrConsortiumAdmin
from monitoring.collectors import (
    celery_queues,
    consortium_registry,
    queue_consumers,
    queue_lengths,
)


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


class QueueSerializer(serializers.Serializer):
    queue = serializers.CharField()
    waiting = serializers.IntegerField(allow_null=True, help_text="tasks not yet taken")
    consumers = serializers.IntegerField(
        allow_null=True, help_text="live workers consuming it; 0: its tasks wait for ever"
    )


class QueuesSerializer(serializers.Serializer):
    queues = QueueSerializer(many=True)


class QueuesView(APIView):
    """``GET``: each Celery queue the coordinator sends work to, how many tasks wait in it
    and how many live workers consume it (people with a role)."""

    @extend_schema(operation_id="queues", responses={200: QueuesSerializer})
    def get(self, request: Request) -> Response:
        require_person_with_role(actor_from_request(request))
        queues = celery_queues()
        waiting = queue_lengths(settings.CELERY_BROKER_URL, queues) or {}
        consumers = queue_consumers(queues) or {}
        rows = [
            {"queue": q, "waiting": waiting.get(q), "consumers": consumers.get(q)} for q in queues
        ]
        return Response(QueuesSerializer({"queues": rows}).data)
