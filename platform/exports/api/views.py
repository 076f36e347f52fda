"""Thin views over the export services: validate, call one service, serialise."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from exports import services
from kernel.actors import actor_from_request
from kernel.api.strict import StrictCharField, StrictSerializer


class ExportSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    recipient = serializers.CharField(source="recipient.slug")
    state = serializers.CharField()
    refused_by = serializers.CharField(source="refused_by.slug", default=None)
    refusal_reason = serializers.CharField()


class ExportCreateSerializer(StrictSerializer):
    recipient = StrictCharField(max_length=100, help_text="slug of the receiving hospital")


class RefuseSerializer(StrictSerializer):
    reason = StrictCharField(max_length=2000, help_text="why the hospital refuses")


@extend_schema(tags=["exports"])
class ExportCreateView(APIView):
    @extend_schema(
        summary="Ask every participating hospital to consent to exporting a completed "
        "job's model to one of them",
        request=ExportCreateSerializer,
        responses={201: ExportSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        serializer = ExportCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        export = services.export_create(
            actor=actor_from_request(request),
            job_id=job_id,
            recipient_slug=serializer.validated_data["recipient"],
        )
        return Response(ExportSerializer(export).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["agent"])
class AgentApproveView(APIView):
    @extend_schema(summary="Approve an export (agent)", request=None, responses=ExportSerializer)
    def post(self, request: Request, export_id: int) -> Response:
        export = services.export_approve(actor=actor_from_request(request), export_id=export_id)
        return Response(ExportSerializer(export).data)


@extend_schema(tags=["agent"])
class AgentRefuseView(APIView):
    @extend_schema(
        summary="Refuse an export (agent)", request=RefuseSerializer, responses=ExportSerializer
    )
    def post(self, request: Request, export_id: int) -> Response:
        serializer = RefuseSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        export = services.export_refuse(
            actor=actor_from_request(request),
            export_id=export_id,
            reason=serializer.validated_data["reason"],
        )
        return Response(ExportSerializer(export).data)
