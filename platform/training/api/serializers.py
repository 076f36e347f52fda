"""How jobs, turns, metric points and assignments look in the API (output only).

Input is checked by :mod:`training.validation` (a job) or by the views' small parsers.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from training.models import HandOff, Job, JobParticipant, MetricPoint, Turn


class ParticipantSerializer(serializers.ModelSerializer):
    hospital = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hospital_name = serializers.CharField(source="hospital.name", read_only=True)

    class Meta:
        model = JobParticipant
        fields = ["position", "hospital", "hospital_name", "feature_set"]


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model_name")
    created_by = serializers.SerializerMethodField()
    participants = ParticipantSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "state",
            "state_reason",
            "state_changed_at",
            "model",
            "spatial_dims",
            "in_channels",
            "num_classes",
            "input_shape",
            "mode",
            "cuts",
            "client_optimizer",
            "server_optimizer",
            "batch_size",
            "local_epochs",
            "max_steps_per_turn",
            "rounds",
            "codec",
            "seed",
            "on_failure",
            "max_retries",
            "participants",
            "current_round",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_created_by(self, job: Job) -> str | None:
        return job.created_by.get_username() if job.created_by_id else None


class StatusTurnSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    position = serializers.IntegerField()
    attempt = serializers.IntegerField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    hospital = serializers.CharField()
    steps = serializers.IntegerField()
    samples = serializers.IntegerField()
    bytes_up = serializers.IntegerField()
    bytes_down = serializers.IntegerField()


class StatusTotalsSerializer(serializers.Serializer):
    steps = serializers.IntegerField()
    samples = serializers.IntegerField()
    bytes_up = serializers.IntegerField()
    bytes_down = serializers.IntegerField()


class JobStatusSerializer(serializers.Serializer):
    """Documents ``GET /api/jobs/{id}/status/`` (the view renders the selector's dict)."""

    id = serializers.IntegerField()
    state = serializers.CharField()
    state_changed_at = serializers.DateTimeField()
    rounds = serializers.IntegerField()
    round = serializers.IntegerField(allow_null=True, help_text="index of the current round")
    turn = StatusTurnSerializer(allow_null=True, help_text="the current (or last) turn")
    hospital = serializers.CharField(allow_null=True, help_text="slug of the current turn's")
    totals = StatusTotalsSerializer(help_text="over every turn of the job so far")
    last_loss = serializers.FloatField(allow_null=True)


class TurnSerializer(serializers.ModelSerializer):
    round = serializers.IntegerField(source="round.index", read_only=True)
    hospital = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Turn
        fields = [
            "id",
            "round",
            "position",
            "attempt",
            "hospital",
            "status",
            "started_at",
            "finished_at",
            "steps",
            "samples",
            "bytes_up",
            "bytes_down",
            "last_loss",
            "metrics",
            "failure_reason",
        ]
        read_only_fields = fields


class MetricPointSerializer(serializers.ModelSerializer):
    class Meta:
        model = MetricPoint
        fields = ["turn", "step", "time", "loss", "samples", "bytes_up", "bytes_down"]
        read_only_fields = fields


class AssignmentTurnSerializer(serializers.ModelSerializer):
    round = serializers.IntegerField(source="round.index", read_only=True)

    class Meta:
        model = Turn
        fields = ["id", "round", "attempt", "status", "started_at", "finished_at"]
        read_only_fields = fields


class HandoffSerializer(serializers.ModelSerializer):
    sender = serializers.CharField(source="sender.slug", read_only=True)
    recipient = serializers.CharField(source="recipient.slug", read_only=True)

    class Meta:
        model = HandOff
        fields = ["id", "job", "turn", "sender", "recipient", "ciphertext_sha256", "size_bytes"]
        read_only_fields = fields


class AssignmentParticipantSerializer(serializers.Serializer):
    hospital = serializers.CharField(source="hospital.slug")
    position = serializers.IntegerField()
    public_key = serializers.CharField(
        source="hospital.public_key", help_text="its X25519 key (base64): seal hand-offs for it"
    )


class HandoffSourceSerializer(serializers.Serializer):
    hospital = serializers.CharField(help_text="who sealed the weights to start from")
    public_key = serializers.CharField()
    round = serializers.IntegerField(help_text="the round of that turn (bound into the seal)")
    turn = serializers.IntegerField()
    ciphertext_sha256 = serializers.CharField(
        allow_null=True, help_text="of the blob sealed for the caller, once recorded"
    )


class AssignmentSerializer(serializers.ModelSerializer):
    """What an agent needs to take part: the training config, its place, its turns, the
    other participants' public keys, and whose sealed weights to start from."""

    job = serializers.IntegerField(source="pk", read_only=True)
    model = serializers.CharField(source="model_name", read_only=True)
    position = serializers.SerializerMethodField()
    feature_set = serializers.SerializerMethodField()
    participant_count = serializers.SerializerMethodField()
    turn = serializers.SerializerMethodField(help_text="its latest turn, or null before any")
    turns = AssignmentTurnSerializer(source="my_turns", many=True, read_only=True)
    participants = AssignmentParticipantSerializer(
        source="all_participants", many=True, read_only=True
    )
    relay_prefix = serializers.SerializerMethodField(
        help_text="what every relay key of this deployment starts with (docs/protocol.md)"
    )
    handoff_from = serializers.SerializerMethodField(
        help_text="the last completed turn's hospital, whose sealed weights the next turn "
        "(and, once the job ended, every participant) starts from; null: start from the "
        "job's seed"
    )

    class Meta:
        model = Job
        fields = [
            "job",
            "state",
            "model",
            "spatial_dims",
            "in_channels",
            "num_classes",
            "input_shape",
            "mode",
            "cuts",
            "client_optimizer",
            "batch_size",
            "local_epochs",
            "max_steps_per_turn",
            "rounds",
            "codec",
            "seed",
            "position",
            "feature_set",
            "participant_count",
            "current_round",
            "turn",
            "turns",
            "participants",
            "handoff_from",
            "state_reason",
            "relay_prefix",
        ]
        read_only_fields = fields

    def get_relay_prefix(self, job: Job) -> str:
        return settings.MEDSPLIT["RELAY_PREFIX"]

    def get_position(self, job: Job) -> int:
        return job.my_participation[0].position

    def get_feature_set(self, job: Job) -> str:
        return job.my_participation[0].feature_set

    def get_participant_count(self, job: Job) -> int:
        return len(job.all_participants)

    @extend_schema_field(HandoffSourceSerializer(allow_null=True))
    def get_handoff_from(self, job: Job) -> dict | None:
        if not job.completed_turns:
            return None
        last = job.completed_turns[-1]
        sealed = next((h for h in job.handoffs_to_me if h.turn_id == last.pk), None)
        return {
            "hospital": last.hospital.slug,
            "public_key": last.hospital.public_key,
            "round": last.round.index,
            "turn": last.pk,
            "ciphertext_sha256": sealed.ciphertext_sha256 if sealed else None,
        }

    @extend_schema_field(AssignmentTurnSerializer(allow_null=True))
    def get_turn(self, job: Job) -> dict | None:
        return AssignmentTurnSerializer(job.my_turns[-1]).data if job.my_turns else None


class RegistryModelSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    default_input_shape = serializers.ListField(child=serializers.IntegerField())
    default_cut = serializers.CharField()
    default_ushaped_cuts = serializers.ListField(child=serializers.CharField())


class CrossingTensorSerializer(serializers.Serializer):
    name = serializers.CharField()
    shape = serializers.ListField(child=serializers.IntegerField())
    dtype = serializers.CharField()


class CutRowSerializer(serializers.Serializer):
    name = serializers.CharField()
    client_params = serializers.IntegerField()
    client_param_share = serializers.FloatField()
    client_flops_per_sample = serializers.IntegerField()
    crossing = CrossingTensorSerializer(many=True)
    values_per_sample = serializers.IntegerField()
    bytes_per_sample = serializers.IntegerField()


class CutTableSerializer(serializers.Serializer):
    model = serializers.CharField()
    input_shape = serializers.ListField(child=serializers.IntegerField())
    cuts = CutRowSerializer(many=True)


class TransitionInputSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
