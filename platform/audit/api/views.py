"""The audit log's API: list, exports and chain check. Each view calls one selector."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.generics import ListAPIView
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.api.export import csv_lines, jsonl_lines
from audit.api.serializers import (
    AuditEventSerializer,
    VerifyResultSerializer,
    WitnessReportSerializer,
)
from audit.models import AuditEvent
from audit.selectors import audit_event_list, audit_verify_chain
from audit.witness import witness_reports
from kernel.actors import actor_from_request
from kernel.api.errors_schema import error

_WHO = (
    "Consortium admins and observers read every event; a hospital admin reads the events "
    "about their hospital. Agents and people without a role get 403."
)

_DENIED = {
    401: error("not signed in, or a bad or revoked agent token"),
    403: error("agents, and people without a role, may not read the audit log"),
}
_READ_ERRORS = {400: error("a filter is malformed: {code, message, details}"), **_DENIED}

#: The query parameters of AuditEventFilter, for the schema (a test keeps them in step).
FILTER_PARAMETERS = [
    OpenApiParameter("actor", OpenApiTypes.STR, description='Who acted, e.g. "person:ada".'),
    OpenApiParameter("action", OpenApiTypes.STR, description='What happened, e.g. "job.started".'),
    OpenApiParameter("hospital", OpenApiTypes.STR, description="Slug of the hospital concerned."),
    OpenApiParameter("job", OpenApiTypes.INT, description="Id of the job concerned."),
    OpenApiParameter(
        "created_after", OpenApiTypes.DATETIME, description="Events at or after this moment."
    ),
    OpenApiParameter(
        "created_before", OpenApiTypes.DATETIME, description="Events before this moment."
    ),
]


@extend_schema(
    tags=["audit"],
    summary="List audit events",
    description=f"Newest first, paginated. {_WHO}",
    parameters=FILTER_PARAMETERS,
    responses={200: AuditEventSerializer(many=True), **_READ_ERRORS},
)
class AuditEventListView(ListAPIView):
    serializer_class = AuditEventSerializer
    filter_backends: list = []  # the selector applies the filters

    def get_queryset(self) -> QuerySet[AuditEvent]:
        return audit_event_list(
            actor=actor_from_request(self.request),
            filters=self.request.query_params,
            newest_first=True,
        )


class _Export(APIView):
    """Streams the filtered events in chain order; errors are answered in JSON."""

    renderer_classes = [JSONRenderer]
    media_type = ""
    filename = ""

    def perform_content_negotiation(
        self, request: Request, force: bool = False
    ) -> tuple[BaseRenderer, str]:
        # The export has one format whatever Accept says; only errors go through DRF.
        renderer = self.get_renderers()[0]
        return renderer, renderer.media_type

    def lines(self, events: QuerySet[AuditEvent]) -> Any:
        raise NotImplementedError

    def get(self, request: Request) -> StreamingHttpResponse:
        events = audit_event_list(actor=actor_from_request(request), filters=request.query_params)
        return StreamingHttpResponse(
            self.lines(events),
            content_type=self.media_type,
            headers={"Content-Disposition": f'attachment; filename="{self.filename}"'},
        )


@extend_schema(
    tags=["audit"],
    summary="Export audit events as CSV",
    description=f"Chain order, streamed; `details` as canonical JSON. {_WHO}",
    parameters=FILTER_PARAMETERS,
    responses={
        (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV"),
        **_READ_ERRORS,
    },
)
class AuditExportCsvView(_Export):
    media_type = "text/csv; charset=utf-8"
    filename = "audit.csv"

    def lines(self, events: QuerySet[AuditEvent]) -> Any:
        return csv_lines(events)


@extend_schema(
    tags=["audit"],
    summary="Export audit events as JSON Lines",
    description=f"Chain order, streamed; one canonical JSON object per line. {_WHO}",
    parameters=FILTER_PARAMETERS,
    responses={
        (200, "application/jsonl"): OpenApiResponse(OpenApiTypes.STR, description="JSON Lines"),
        **_READ_ERRORS,
    },
)
class AuditExportJsonlView(_Export):
    media_type = "application/jsonl; charset=utf-8"
    filename = "audit.jsonl"

    def lines(self, events: QuerySet[AuditEvent]) -> Any:
        return jsonl_lines(events)


class AuditVerifyView(APIView):
    @extend_schema(
        tags=["audit"],
        summary="Check the audit chain",
        description=(
            "Re-hashes every event and names the first that does not match. Consortium "
            "admins and observers only."
        ),
        responses={
            200: VerifyResultSerializer,
            401: _DENIED[401],
            403: error("only consortium admins and observers check the chain"),
        },
    )
    def get(self, request: Request) -> Response:
        result = audit_verify_chain(actor=actor_from_request(request))
        return Response(VerifyResultSerializer(result).data)


class WitnessReportListView(APIView):
    @extend_schema(
        tags=["audit"],
        summary="The hospitals' witness reports",
        description=(
            "Each hospital's agent keeps the chain heads it was shown and checks that they "
            "are still in the chain; a report says one is gone (the history was rewritten). "
            "Newest first. Consortium admins and observers see all, a hospital admin their "
            "own hospital's."
        ),
        responses={200: WitnessReportSerializer(many=True), **_DENIED},
    )
    def get(self, request: Request) -> Response:
        reports = witness_reports(actor=actor_from_request(request))
        return Response(WitnessReportSerializer(reports, many=True).data)
