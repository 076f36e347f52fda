"""What the audit API returns."""

from __future__ import annotations

from rest_framework import serializers

from audit.chain import CONTENT_FIELDS, TIMESTAMP_FORMAT
from audit.models import AuditEvent, WitnessReport
from audit.selectors import ProblemKind

#: The canonical content's timestamp format (see audit.chain), so rows can be re-hashed.


class AuditEventSerializer(serializers.ModelSerializer):
    created_at = serializers.DateTimeField(format=TIMESTAMP_FORMAT)

    class Meta:
        model = AuditEvent
        # Exactly what the hash covers, plus the hash: anyone can re-check a row.
        fields = [*CONTENT_FIELDS, "hash"]
        read_only_fields = fields


class ProblemSerializer(serializers.Serializer):
    row_id = serializers.IntegerField(
        allow_null=True, help_text="Id of the row that does not match, or of the first missing."
    )
    kind = serializers.ChoiceField(choices=[k.value for k in ProblemKind])
    message = serializers.CharField()


class VerifyResultSerializer(serializers.Serializer):
    ok = serializers.BooleanField(help_text="The whole chain verifies.")
    checked = serializers.IntegerField(help_text="Rows that matched before the first problem.")
    head_id = serializers.IntegerField(help_text="The last event's id, as the head records it.")
    head_hash = serializers.CharField(help_text="The last event's hash, as the head records it.")
    problem = ProblemSerializer(allow_null=True, help_text="The first problem, if any.")


class WitnessReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = WitnessReport
        fields = [
            "hospital",
            "received_at",
            "witnessed_seq",
            "witnessed_hash",
            "found",
            "message",
            "verified",
        ]
        read_only_fields = fields
