"""What the audit API returns."""

from __future__ import annotations

from rest_framework import serializers

from audit.models import AuditEvent
from audit.selectors import ProblemKind

#: The canonical content's timestamp format (see audit.chain), so rows can be re-hashed.
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class AuditEventSerializer(serializers.ModelSerializer):
    created_at = serializers.DateTimeField(format=TIMESTAMP_FORMAT)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "prev_hash",
            "created_at",
            "actor_kind",
            "actor",
            "action",
            "target",
            "hospital",
            "job_id",
            "details",
            "source_ip",
            "hash",
        ]
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
