"""Thin views over the export services: validate, call one service, serialise."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from exports import services
from exports.signing import export_signing_key
from kernel.actors import actor_from_request
from kernel.api.strict import StrictCharField, StrictSerializer
from kernel.errors import InvalidInput
from medsplit.protocol.keys import identity_public_b64
from training.api.key_views import RECIPIENT_KEY_CHARS, SIGNATURE_CHARS


class ExportSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    recipient = serializers.CharField(source="recipient.slug")
    state = serializers.CharField()
    refused_by = serializers.CharField(source="refused_by.slug", default=None)
    refusal_reason = serializers.CharField()


class PartSerializer(serializers.Serializer):
    name = serializers.CharField()
    size_bytes = serializers.IntegerField()
    sha256 = serializers.CharField()


class ExportDetailSerializer(ExportSerializer):
    """What a participant's agent needs: the export key, the parts, the server's signer."""

    recipient_key = serializers.SerializerMethodField()
    parts = PartSerializer(many=True, read_only=True)
    expected_parts = serializers.SerializerMethodField()
    server_identity = serializers.SerializerMethodField()

    def get_recipient_key(self, export) -> dict[str, str] | None:
        if not export.recipient_key:
            return None
        return {"key": export.recipient_key, "signature": export.recipient_key_signature}

    def get_expected_parts(self, export) -> list[str]:
        return services.expected_parts(export)

    def get_server_identity(self, export) -> str:
        return identity_public_b64(export_signing_key())


class ExportKeySerializer(StrictSerializer):
    key = StrictCharField(max_length=RECIPIENT_KEY_CHARS, help_text="HPKE public key, base64")
    signature = StrictCharField(
        max_length=SIGNATURE_CHARS,
        help_text="ML-DSA-65 signature by the recipient's identity key over export-N, the "
        "hospital and the key (SignedRecipientKey), base64",
    )


class FetchedSerializer(StrictSerializer):
    parts = serializers.IntegerField(min_value=0)
    size_bytes = serializers.IntegerField(min_value=0)


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


@extend_schema(tags=["agent"])
class AgentExportView(APIView):
    @extend_schema(
        summary="An export as a participant sees it (agent)", responses=ExportDetailSerializer
    )
    def get(self, request: Request, export_id: int) -> Response:
        export = services.export_view(actor=actor_from_request(request), export_id=export_id)
        return Response(ExportDetailSerializer(export).data)


@extend_schema(tags=["agent"])
class AgentExportKeyView(APIView):
    @extend_schema(
        summary="Publish the receiving hospital's fresh export key, signed (agent)",
        request=ExportKeySerializer,
        responses={201: ExportSerializer},
    )
    def post(self, request: Request, export_id: int) -> Response:
        serializer = ExportKeySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        export = services.export_key_publish(
            actor=actor_from_request(request), export_id=export_id, **serializer.validated_data
        )
        return Response(ExportSerializer(export).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["agent"])
class AgentExportPartsView(APIView):
    @extend_schema(
        summary="Leave this hospital's segments sealed to the export key (agent; the body "
        "is the sealed blob, application/octet-stream)",
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: PartSerializer},
    )
    def post(self, request: Request, export_id: int) -> Response:
        actor = actor_from_request(request)
        # Read from the stream: Django's request.body caps bodies at a form's size.
        stream = request.stream
        blob = stream.read(services.MAX_PART_BYTES + 1) if stream is not None else b""
        if not isinstance(blob, bytes):
            raise InvalidInput("a sealed part is sent as bytes")
        part = services.export_part_upload(actor=actor, export_id=export_id, blob=blob)
        return Response(PartSerializer(part).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["agent"])
class AgentExportPartView(APIView):
    @extend_schema(
        summary="One sealed part (agent: the receiving hospital only)",
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def get(self, request: Request, export_id: int, name: str) -> HttpResponse:
        part = services.export_part_download(
            actor=actor_from_request(request), export_id=export_id, name=name
        )
        return HttpResponse(bytes(part.ciphertext), content_type="application/octet-stream")


@extend_schema(tags=["agent"])
class AgentExportFetchedView(APIView):
    @extend_schema(
        summary="The receiving agent assembled and checked the model (agent)",
        request=FetchedSerializer,
        responses=ExportSerializer,
    )
    def post(self, request: Request, export_id: int) -> Response:
        serializer = FetchedSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        export = services.export_fetched(
            actor=actor_from_request(request), export_id=export_id, **serializer.validated_data
        )
        return Response(ExportSerializer(export).data)
