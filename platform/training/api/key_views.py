"""The agent's per-job recipient key: a thin view that validates and calls one service."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.actors import actor_from_request
from kernel.api.strict import StrictCharField, StrictSerializer
from kernel.permissions import require_agent
from training import agent_services

#: Base64 of the 1,216-byte hybrid public key and of a 3,309-byte ML-DSA-65 signature.
RECIPIENT_KEY_CHARS = 1624
SIGNATURE_CHARS = 4412


class RecipientKeyInputSerializer(StrictSerializer):
    key = StrictCharField(
        max_length=RECIPIENT_KEY_CHARS,
        help_text="the per-job HPKE public key: ML-KEM-768 then X25519, 1,216 bytes, base64",
    )
    signature = StrictCharField(
        max_length=SIGNATURE_CHARS,
        help_text="ML-DSA-65 signature by the hospital's identity key over the job, the "
        "hospital and the key (medsplit.protocol.keys.SignedRecipientKey), base64",
    )


class RecipientKeySerializer(serializers.Serializer):
    job = serializers.IntegerField(source="job_id")
    hospital = serializers.CharField(source="hospital.slug")
    sha256 = serializers.CharField(source="recipient_key_sha256")
    generation = serializers.IntegerField(source="recipient_key_generation")
    published_at = serializers.DateTimeField(source="recipient_key_published_at")


@extend_schema(tags=["agent"])
class AgentRecipientKeyView(APIView):
    @extend_schema(
        summary="Publish the agent's per-job recipient key for a job, signed with its "
        "identity key (the other participants seal their hand-offs to it)",
        request=RecipientKeyInputSerializer,
        responses={201: RecipientKeySerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = actor_from_request(request)
        require_agent(actor, "publish a recipient key")  # before judging the input
        serializer = RecipientKeyInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        participant = agent_services.agent_recipient_key_publish(
            actor=actor, job_id=job_id, **serializer.validated_data
        )
        return Response(RecipientKeySerializer(participant).data, status=status.HTTP_201_CREATED)
