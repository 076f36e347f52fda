"""How jobs, turns, metric points and assignments look in the API (output only).

Input is checked by :mod:`training.validation` (a job) or by the views' small parsers.
"""

from __future__ import annotations

import dataclasses

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hospitals.hijack import hijack_alerts
from kernel.actors import Actor
from kernel.permissions import sees_participant_in_full
from medsplit.errors import UnknownModeError
from medsplit.modes import StartFrom
from medsplit.training.description import FORMAT, JobDescription
from medsplit.training.tasks import DEFAULT_TASK, TASKS, TaskSpec
from medsplit.turns.evaluation import evaluation_round
from training.alignment import alignment_summary
from training.leakage import leakage_summary
from training.models import (
    Aggregation,
    Evaluation,
    HandOff,
    HospitalEvaluation,
    Job,
    JobParticipant,
    MetricPoint,
    Turn,
)
from training.plan import TurnStart, job_result, turn_start
from training.states import JobState


def _viewer(serializer: serializers.Field) -> Actor | None:
    """The actor the answer is for (the views put it in the context)."""
    return serializer.context.get("actor")


def in_full(actor: Actor | None, hospital_id: object) -> bool:
    """Whether ``actor`` sees the part of hospital ``hospital_id`` in full; without an
    actor, nobody does (fail closed)."""
    return actor is not None and sees_participant_in_full(actor, hospital_id)


def visible_state_reason(job: Job, actor: Actor | None) -> str:
    """The job's state reason, or, when it tells another hospital's failure, only which
    turn failed (kernel.permissions: least privilege)."""
    if job.state_reason_hospital_id is None or in_full(actor, job.state_reason_hospital_id):
        return job.state_reason
    return job.state_reason_shared


class _ShownInPartToOthers:
    """A row about one hospital's part in a job: whoever may see that part in full
    (:func:`kernel.permissions.sees_participant_in_full`) gets every field; everyone
    else only ``shown_to_others``, the rest left out of the answer."""

    shown_to_others: tuple[str, ...] = ()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()  # type: ignore[misc]
        for name, field in fields.items():
            if name not in self.shown_to_others:
                # Output only: not read-only so that the schema marks it as optional
                # (drf-spectacular makes every read-only field required).
                field.read_only, field.required = False, False
        return fields

    def row_hospital_id(self, instance: object) -> object:
        return instance.hospital_id  # type: ignore[attr-defined]

    def to_representation(self, instance: object) -> dict:
        data = super().to_representation(instance)  # type: ignore[misc]
        if in_full(_viewer(self), self.row_hospital_id(instance)):
            return data
        return {name: value for name, value in data.items() if name in self.shown_to_others}


def job_task(job: Job) -> TaskSpec:
    """The job's task, as its stored description names it (one from before tasks:
    classification)."""
    described = job.description if isinstance(job.description, dict) else {}
    return TASKS.get(str(described.get("task") or DEFAULT_TASK), TASKS[DEFAULT_TASK])


class ParticipantSerializer(_ShownInPartToOthers, serializers.ModelSerializer):
    """A participant; of another hospital, its name and place in the order only."""

    shown_to_others = ("position", "hospital", "hospital_name")
    hospital = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hospital_name = serializers.CharField(source="hospital.name", read_only=True)

    class Meta:
        model = JobParticipant
        fields = ["position", "hospital", "hospital_name", "feature_set"]


_OPTION_FIELDS = {
    "str": lambda: serializers.CharField(),
    "int": lambda: serializers.IntegerField(),
    "int | None": lambda: serializers.IntegerField(allow_null=True),
    "tuple[int, ...]": lambda: serializers.ListField(child=serializers.IntegerField()),
    "tuple[str, ...]": lambda: serializers.ListField(child=serializers.CharField()),
    "Augmentation": lambda: serializers.ListField(child=serializers.DictField()),
}


def _description_serializer() -> type[serializers.Serializer]:
    """The schema of medsplit's JobDescription JSON form, made from the dataclass's own
    fields so that the contract is written down once (medsplit/training/description.py)."""
    attrs: dict[str, serializers.Field] = {}
    for f in dataclasses.fields(JobDescription):
        make = _OPTION_FIELDS.get(str(f.type), lambda: serializers.DictField())
        attrs[f.name] = make()
    attrs["version"] = serializers.IntegerField(
        help_text=f"the JSON form's version ({FORMAT}); a party refuses one it does not read"
    )
    attrs["__doc__"] = (
        "What a job trains and how (medsplit.training.description.JobDescription), "
        "as stored and as workers and agents read it."
    )
    return type("JobDescriptionSerializer", (serializers.Serializer,), attrs)


JobDescriptionSerializer = _description_serializer()


@extend_schema_field(JobDescriptionSerializer)
class DescriptionField(serializers.JSONField):
    """A job's description, served as stored."""


class AlignmentStateSerializer(serializers.Serializer):
    """A vertical job's record alignment: sizes and the outcome only, never a digest or an
    identifier (``training/alignment.py``)."""

    status = serializers.ChoiceField(
        choices=["pending", "agreed", "mismatch", "too_small", "failed"],
        help_text="pending until every party reported; agreed: all hold one intersection; "
        "mismatch, too_small: the job failed; failed: the job ended undecided",
    )
    size = serializers.IntegerField(
        allow_null=True, help_text="the intersection's size, once agreed or too small"
    )
    reported = serializers.IntegerField(help_text="how many parties have reported")
    parties = serializers.IntegerField(help_text="how many parties the job has")
    minimum = serializers.IntegerField(help_text="the smallest intersection the job trains on")
    reason = serializers.CharField(help_text="why it failed, if it did")


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model_name")
    description = DescriptionField(read_only=True)
    created_by = serializers.SerializerMethodField()
    participants = ParticipantSerializer(many=True, read_only=True)
    aggregations = serializers.SerializerMethodField(
        help_text="its secure aggregation attempts, round by round (modes that aggregate "
        "securely): who took part with which weight, who submitted (digest and size), the "
        "aggregate's digest, who was left out and why; never a value"
    )
    alignment = serializers.SerializerMethodField(
        help_text="its record alignment (jobs whose parties align records: pending until "
        "every party reported): status, the intersection's size and minimum; never a digest"
    )
    label_leakage = serializers.SerializerMethodField(
        help_text="its label-leakage audit (jobs with passive parties): per round and "
        "passive party, the records scored and the norm and cosine attacks' ROC AUC against "
        "the labels (0.5 is chance; 1.0 or 0.0 recovers every label)"
    )
    hijack_alerts = serializers.SerializerMethodField(
        help_text="hospitals whose agent found the server's gradients unlike honest "
        "training's and stopped taking part (privacy.hijack_detection): who, which turn, "
        "when, and the agent's reason"
    )
    task = serializers.SerializerMethodField(
        help_text="what it learns (GET /api/tasks/): classification or segmentation"
    )
    metric = serializers.SerializerMethodField(
        help_text="the validation metric its turns report in their metrics besides "
        "val_loss: val_accuracy (classification) or val_dice (segmentation: mean Dice)"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "state",
            "state_reason",
            "state_changed_at",
            "model",
            "mode",
            "task",
            "metric",
            "rounds",
            "description",
            "on_failure",
            "max_retries",
            "round_deadline_seconds",
            "participants",
            "aggregations",
            "alignment",
            "label_leakage",
            "hijack_alerts",
            "current_round",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_created_by(self, job: Job) -> str | None:
        return job.created_by.get_username() if job.created_by_id else None

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_aggregations(self, job: Job) -> list[dict]:
        rows = job.aggregations.order_by("round_index", "group", "attempt")
        return [
            {k: v for k, v in AggregationSerializer(a).data.items() if k != "counts"} for a in rows
        ]

    def get_task(self, job: Job) -> str:
        return job_task(job).name

    def get_metric(self, job: Job) -> str:
        return f"val_{job_task(job).metric}"

    @extend_schema_field(AlignmentStateSerializer(allow_null=True))
    def get_alignment(self, job: Job) -> dict | None:
        return alignment_summary(job)

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_label_leakage(self, job: Job) -> list[dict]:
        return leakage_summary(job)

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_hijack_alerts(self, job: Job) -> list[dict]:
        return hijack_alerts(job_id=job.pk)

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
        data["state_reason"] = visible_state_reason(job, _viewer(self))
        return data


class StatusTurnSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    position = serializers.IntegerField()
    attempt = serializers.IntegerField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    hospital = serializers.CharField()
    samples = serializers.IntegerField()
    steps = serializers.IntegerField(required=False, help_text="absent: another hospital's")
    bytes_up = serializers.IntegerField(required=False, help_text="absent: another hospital's")
    bytes_down = serializers.IntegerField(required=False, help_text="absent: another hospital's")


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
    totals = StatusTotalsSerializer(
        help_text="over the turns so far that you see in full: every turn, or for a "
        "hospital admin their hospital's"
    )
    last_loss = serializers.FloatField(
        allow_null=True, help_text="of the current turn; null for another hospital's"
    )


class TurnSerializer(_ShownInPartToOthers, serializers.ModelSerializer):
    """A turn; of another hospital's, its place, state and sample count only."""

    shown_to_others = ("id", "round", "position", "attempt", "hospital", "status", "samples")
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


class LossRoundSerializer(serializers.Serializer):
    round = serializers.IntegerField(help_text="index of the round, from 0")
    start = serializers.IntegerField(help_text="the job step at which it starts")


class LossCurveSerializer(serializers.Serializer):
    hospital = serializers.CharField()
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="[job step, training loss] pairs in step order (thinned to at most a few "
        "hundred)",
    )


class LossSeriesSerializer(serializers.Serializer):
    """Documents ``GET /api/jobs/{id}/loss-series/`` (the view renders the selector's dict)."""

    loss_from = serializers.ChoiceField(
        choices=["server", "hospital"],
        allow_null=True,
        help_text="who computes the loss in the job's mode: the worker, or the hospital "
        "(which reports it)",
    )
    total_steps = serializers.IntegerField(help_text="steps on the job's axis so far")
    rounds = LossRoundSerializer(many=True)
    turn_steps = serializers.DictField(
        child=serializers.IntegerField(allow_null=True),
        help_text="steps one turn of each hospital takes (its reported training split, batch "
        "size, local epochs, drop_last, step limit); null before it reported split sizes, and "
        "for a hospital admin, of the other hospitals",
    )
    series = LossCurveSerializer(many=True, help_text="one curve per hospital you see")


class ResultHospitalSerializer(serializers.Serializer):
    hospital = serializers.CharField(help_text="its slug")
    name = serializers.CharField()
    position = serializers.IntegerField()
    status = serializers.ChoiceField(
        choices=["running", "completed", "failed", "no_test_set"],
        help_text="no_test_set: the hospital reported no local test set",
    )
    test_samples = serializers.IntegerField(
        required=False, help_text="the figures below: your own hospital's only (hospital admins)"
    )
    accuracy = serializers.FloatField(required=False, allow_null=True)
    auc = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="macro one-against-the-rest ROC AUC (MONAI's compute_roc_auc); null where "
        "the test set lacks a class",
    )
    baseline_accuracy = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="the accuracy of always answering the hospital's most common training class",
    )
    dice = serializers.FloatField(
        required=False, allow_null=True, help_text="segmentation: mean Dice (no background)"
    )
    reason = serializers.CharField(required=False, help_text="why it failed, if it did")
    bytes_up = serializers.IntegerField(required=False)
    bytes_down = serializers.IntegerField(required=False)
    finished_at = serializers.DateTimeField(required=False, allow_null=True)


class ResultEvaluationSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["running", "completed"])
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    requested_by = serializers.CharField(
        allow_null=True, help_text="who asked; null: started as the job completed"
    )


class JobResultsSerializer(serializers.Serializer):
    """Documents ``GET /api/jobs/{id}/results/`` (the view renders the selector's dict)."""

    job = serializers.IntegerField()
    task = serializers.CharField()
    figures = serializers.ListField(
        child=serializers.CharField(),
        help_text="the figures of the job's task: accuracy, auc, baseline_accuracy "
        "(classification) or dice (segmentation)",
    )
    evaluable = serializers.BooleanField(
        help_text="whether the job's mode can be evaluated through the split"
    )
    refusal = serializers.CharField(help_text="why not, when it cannot (vertical)")
    evaluation = ResultEvaluationSerializer(
        allow_null=True, help_text="the latest evaluation; null before any"
    )
    hospitals = ResultHospitalSerializer(many=True)
    weighted_mean = serializers.DictField(
        allow_null=True,
        help_text="label (says what it is), hospitals (how many it averages), each figure "
        "(null where no hospital measured it), and for those who see every hospital "
        "test_samples (the total) and without ({figure: hospitals left out}); null before "
        "any hospital's figures",
    )


class AssignmentEvaluationSerializer(serializers.ModelSerializer):
    """The hospital's part in the job's latest evaluation, as its agent needs it."""

    attempt = serializers.IntegerField(source="evaluation.attempt", read_only=True)
    round = serializers.SerializerMethodField(
        help_text="the round number its frames carry (past the job's rounds)"
    )

    class Meta:
        model = HospitalEvaluation
        fields = ["id", "attempt", "round", "status", "test_samples"]
        read_only_fields = fields

    def get_round(self, part: HospitalEvaluation) -> int:
        return evaluation_round(part.job.rounds, part.evaluation.attempt)


class AssignmentPredictionSerializer(AssignmentEvaluationSerializer):
    """The hospital's part in the job's latest vertical prediction: as an evaluation's,
    with its failure reason (the party or the check that ended it)."""

    class Meta(AssignmentEvaluationSerializer.Meta):
        fields = [*AssignmentEvaluationSerializer.Meta.fields, "failure_reason"]
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


class PublishedRecipientKeySerializer(serializers.Serializer):
    key = serializers.CharField(help_text="ML-KEM-768 + X25519 public key, base64")
    signature = serializers.CharField(help_text="by the hospital's identity key, base64")
    sha256 = serializers.CharField()
    published_at = serializers.DateTimeField()


class AssignmentParticipantSerializer(serializers.Serializer):
    hospital = serializers.CharField(source="hospital.slug")
    position = serializers.IntegerField()
    identity_key = serializers.CharField(
        source="hospital.identity_key",
        help_text="its ML-DSA-65 identity key (base64; empty before it moved to one): pin it",
    )
    identity_fingerprint = serializers.CharField(source="hospital.identity_fingerprint")
    identity_generation = serializers.IntegerField(
        source="hospital.identity_generation",
        help_text="advances with each re-enrolment under a new key (audited)",
    )
    identity_enrolled_at = serializers.DateTimeField(
        source="hospital.identity_enrolled_at", allow_null=True
    )
    recipient_key = serializers.SerializerMethodField(
        help_text="its per-job key for this job, signed by its identity key: seal hand-offs "
        "to it; null until published under its current identity"
    )

    @extend_schema_field(PublishedRecipientKeySerializer(allow_null=True))
    def get_recipient_key(self, participant: JobParticipant) -> dict | None:
        # A key signed by an identity the hospital replaced since would be refused anyway.
        if (
            not participant.recipient_key
            or participant.recipient_key_generation != participant.hospital.identity_generation
        ):
            return None
        return {
            "key": participant.recipient_key,
            "signature": participant.recipient_key_signature,
            "sha256": participant.recipient_key_sha256,
            "published_at": participant.recipient_key_published_at,
        }


class AggregationSerializer(serializers.ModelSerializer):
    """One attempt of a group's secure aggregation: who takes part with which public
    weight, who has submitted (digest and size), the aggregate's digest once done, and the
    participants' integer buffers (public batch counts) once done."""

    round = serializers.IntegerField(source="round_index", read_only=True)
    submitted = serializers.SerializerMethodField(
        help_text="per hospital that submitted: its masked vector's sha256 and size"
    )
    counts = serializers.SerializerMethodField(
        help_text="once done: each participant's integer buffers (combined by their maximum)"
    )

    class Meta:
        model = Aggregation
        fields = [
            "id",
            "round",
            "group",
            "attempt",
            "weights",
            "status",
            "submitted",
            "aggregate_sha256",
            "aggregate_size_bytes",
            "counts",
            "dropped",
            "failure_reason",
            "created_at",
            "deadline_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_submitted(self, aggregation: Aggregation) -> dict:
        return {
            h: {"sha256": s["sha256"], "size_bytes": s["size_bytes"]}
            for h, s in sorted(aggregation.submissions.items())
        }

    def get_counts(self, aggregation: Aggregation) -> dict | None:
        if aggregation.status != Aggregation.Status.DONE:
            return None
        return {h: s["counts"] for h, s in sorted(aggregation.submissions.items())}


class HandoffSourceSerializer(serializers.Serializer):
    hospital = serializers.CharField(help_text="who sealed the weights to start from")
    identity_fingerprint = serializers.CharField(
        help_text="its identity key's (the participants list holds the key)"
    )
    round = serializers.IntegerField(help_text="the round of that turn (bound into the seal)")
    turn = serializers.IntegerField()
    ciphertext_sha256 = serializers.CharField(
        allow_null=True, help_text="of the blob sealed for the caller, once recorded"
    )


class StartFromSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=[k.value for k in StartFrom],
        help_text="previous: the hand-off of the turn before; initial: the job's seed; "
        "aggregate: the job mode's combination of the last group's hand-offs",
    )
    sources = HandoffSourceSerializer(
        many=True, help_text="the turns whose sealed weights to start from, in position order"
    )
    aggregation = AggregationSerializer(
        allow_null=True,
        required=False,
        help_text="in a mode that aggregates securely: the done aggregation whose aggregate "
        "(unmasked by each hospital) to start from; the sources are its participants' turns",
    )


def _aggregation_of(start: TurnStart) -> dict | None:
    return AggregationSerializer(start.aggregation).data if start.aggregation else None


class AssignmentSerializer(serializers.ModelSerializer):
    """What an agent needs to take part: the training config, its place, its turns, the
    other participants' public keys, and whose sealed weights to start from."""

    job = serializers.IntegerField(source="pk", read_only=True)
    description = DescriptionField(
        read_only=True,
        help_text="what the job trains and how: build the model and the "
        "training settings from it (medsplit's JobDescription.from_json)",
    )
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
    start_from = serializers.SerializerMethodField(
        help_text="where its latest turn starts (the job mode's round plan); null before any turn"
    )
    result_from = serializers.SerializerMethodField(
        help_text="once the job completed, where its final weights come from (the job "
        "mode's result: the last turn's hand-off, or the combination of the last group's); "
        "null before"
    )
    aggregation = serializers.SerializerMethodField(
        help_text="the job's latest secure aggregation attempt this hospital takes part in "
        "(modes that aggregate securely); null when none"
    )
    evaluation = serializers.SerializerMethodField(
        help_text="this hospital's part in the job's latest evaluation of its final model "
        "(once it completed); null when none"
    )
    prediction = serializers.SerializerMethodField(
        help_text="a vertical job's: this hospital's part in its label party's latest "
        "prediction request (every party's agent answers it); null when none"
    )

    class Meta:
        model = Job
        fields = [
            "job",
            "state",
            "description",
            "position",
            "feature_set",
            "participant_count",
            "current_round",
            "turn",
            "turns",
            "participants",
            "handoff_from",
            "start_from",
            "result_from",
            "aggregation",
            "evaluation",
            "prediction",
            "state_reason",
            "relay_prefix",
        ]
        read_only_fields = fields

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
        # Its own failure reasons only (kernel.permissions: least privilege).
        data["state_reason"] = visible_state_reason(job, _viewer(self))
        return data

    @extend_schema_field(AggregationSerializer(allow_null=True))
    def get_aggregation(self, job: Job) -> dict | None:
        slug = job.my_participation[0].hospital.slug
        mine = [a for a in job.all_aggregations if slug in a.weights]
        return AggregationSerializer(mine[-1]).data if mine else None

    @extend_schema_field(AssignmentEvaluationSerializer(allow_null=True))
    def get_evaluation(self, job: Job) -> dict | None:
        mine = self._parts(job, Evaluation.Purpose.EVALUATION)
        return AssignmentEvaluationSerializer(mine[-1]).data if mine else None

    @extend_schema_field(AssignmentPredictionSerializer(allow_null=True))
    def get_prediction(self, job: Job) -> dict | None:
        """The hospital's part in the job's latest vertical prediction (its label
        party's request, ``training/vertical_prediction.py``)."""
        mine = self._parts(job, Evaluation.Purpose.PREDICTION)
        return AssignmentPredictionSerializer(mine[-1]).data if mine else None

    def _parts(self, job: Job, purpose: str) -> list[HospitalEvaluation]:
        mine = getattr(job, "my_evaluations", None)
        if mine is None:
            hospital = job.my_participation[0].hospital
            mine = list(
                job.hospital_evaluations.filter(hospital=hospital)
                .select_related("evaluation", "job")
                .order_by("evaluation__attempt")
            )
        return [p for p in mine if p.evaluation.purpose == purpose]

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
            "identity_fingerprint": last.hospital.identity_fingerprint,
            "round": last.round.index,
            "turn": last.pk,
            "ciphertext_sha256": sealed.ciphertext_sha256 if sealed else None,
        }

    @extend_schema_field(StartFromSerializer(allow_null=True))
    def get_start_from(self, job: Job) -> dict | None:
        if not job.my_turns:
            return None
        try:
            start = turn_start(turn=job.my_turns[-1], completed=job.completed_turns)
        except UnknownModeError:
            # Taken out of MEDSPLIT["EXTRA_MODES"] since: its turns fail at the worker,
            # saying so; the agent's other assignments must still be served.
            return None
        return {
            "kind": start.kind.value,
            "sources": [self._source(job, t) for t in start.sources],
            "aggregation": _aggregation_of(start),
        }

    @extend_schema_field(StartFromSerializer(allow_null=True))
    def get_result_from(self, job: Job) -> dict | None:
        if job.state != JobState.COMPLETED:
            return None
        try:
            result = job_result(job=job, completed=job.completed_turns)
        except UnknownModeError:
            return None  # as for start_from
        return {
            "kind": result.kind.value,
            "sources": [self._source(job, t) for t in result.sources],
            "aggregation": _aggregation_of(result),
        }

    def _source(self, job: Job, turn: Turn) -> dict:
        sealed = next((h for h in job.handoffs_to_me if h.turn_id == turn.pk), None)
        return {
            "hospital": turn.hospital.slug,
            "identity_fingerprint": turn.hospital.identity_fingerprint,
            "round": turn.round.index,
            "turn": turn.pk,
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
    tasks = serializers.ListField(
        child=serializers.CharField(), help_text="the tasks the model learns (GET /api/tasks/)"
    )
    default_cuts = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="the model's default cuts in each mode, by the mode's name",
    )


class ModelModulesSerializer(serializers.Serializer):
    modules = serializers.ListField(
        child=serializers.CharField(),
        help_text="the modules (a package: the modules inside it too) whose MODULE:FACTORY "
        "models this coordinator builds; a job's every participant must list it too",
    )
    setting = serializers.CharField(help_text="the coordinator's setting that lists them")


class ModeOptionSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["int", "float", "str", "bool"])
    default = serializers.JSONField()
    help = serializers.CharField()


class ModeSegmentSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="0 is the first segment, before the first cut")
    party = serializers.CharField()
    side = serializers.ChoiceField(choices=["hospital", "server"])


class ModeConfigurationSerializer(serializers.Serializer):
    options = serializers.DictField(help_text="the job's mode_options for this configuration")
    title = serializers.CharField()
    cuts = serializers.IntegerField()
    labels = serializers.ChoiceField(choices=["hospital", "server"])
    segments = ModeSegmentSerializer(many=True)
    runs_on_platform = serializers.BooleanField()


class ModeSerializer(serializers.Serializer):
    """A split-learning mode as it describes itself (medsplit.modes.ModeDescription)."""

    name = serializers.CharField(help_text="what a job's mode field takes")
    title = serializers.CharField()
    summary = serializers.CharField()
    cuts = serializers.IntegerField(help_text="how many cuts a job in this mode gives")
    labels = serializers.ChoiceField(
        choices=["hospital", "server"], help_text="who holds the labels and computes the loss"
    )
    segments = ModeSegmentSerializer(many=True)
    options = ModeOptionSerializer(many=True)
    runs_on_platform = serializers.BooleanField(
        help_text="whether the coordinator accepts this mode's jobs yet (false: it runs in "
        "process only, with `medsplit simulate` and `medsplit verify`)"
    )
    configurations = ModeConfigurationSerializer(
        many=True,
        help_text="the mode under each combination of its options' choices (what a form "
        "offers as one choice each); empty for a mode without such options",
    )
    feature_sets = serializers.BooleanField(
        help_text="whether its parties hold different features of the same patients (each "
        "participant names its feature set; one other than the first may run a model of its "
        "own, party_models)"
    )


class CodecSerializer(serializers.Serializer):
    """A wire codec as it describes itself (medsplit.wire.codecs.describe_codecs)."""

    name = serializers.CharField(help_text="what a job's codec field takes")
    exact = serializers.BooleanField(
        help_text="every tensor crosses bit for bit: only then does training stay exact"
    )
    summary = serializers.CharField()


class TaskSerializer(serializers.Serializer):
    """A task a job may have (medsplit.training.tasks.TASKS)."""

    name = serializers.CharField(help_text="what a job's task field takes")
    description = serializers.CharField()
    losses = serializers.ListField(
        child=serializers.CharField(), help_text="what a job's loss field takes with this task"
    )
    default_loss = serializers.CharField(help_text="the loss of a job that names none")
    metric = serializers.CharField(
        help_text="what validation reports besides the loss, as val_<metric> in a turn's "
        "metrics: accuracy or dice"
    )


class AugmentationSerializer(serializers.Serializer):
    """A transform a job's augmentation can name
    (medsplit.training.augment.describe_augmentations)."""

    name = serializers.CharField(help_text="what an augmentation item's name takes")
    description = serializers.CharField()
    params = serializers.DictField(help_text="each parameter it takes, with its default")


class OptimizerOptionSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["int", "float", "str", "list"])
    default = serializers.JSONField()
    help = serializers.CharField()


class OptimizerKindSerializer(serializers.Serializer):
    name = serializers.CharField()
    title = serializers.CharField()
    options = OptimizerOptionSerializer(many=True, help_text="the options it reads")


class OptimizersSerializer(serializers.Serializer):
    """The optimizers and schedules (medsplit.protocol.optim.describe_optimizers)."""

    optimizers = OptimizerKindSerializer(many=True, help_text="what an optimizer's name takes")
    schedules = OptimizerKindSerializer(many=True, help_text="what its schedule takes")
    defaults = serializers.DictField(help_text="an optimizer's every option when a job omits it")


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
