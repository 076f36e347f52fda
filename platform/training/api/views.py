"""Thin API views of the training app: parse, call one selector or service, render."""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.actors import Actor, actor_from_request
from kernel.api.errors_schema import error
from kernel.api.strict import StrictCharField, StrictIntegerField, StrictSerializer
from kernel.api.throttling import ScopedThrottle
from kernel.errors import InvalidInput
from kernel.permissions import require_agent
from medsplit.turns.evaluation import evaluation_round
from medsplit.turns.inference import INFERENCE_TOPIC, inference_round
from training import agent_services, selectors, services
from training.aggregation import aggregation_submit
from training.alignment import alignment_get, alignment_report, alignment_state
from training.api.filters import JobFilter
from training.api.long_poll import ANSWERS_BUILT, long_poll, wait_for_change
from training.api.serializers import (
    AggregationSerializer,
    AlignmentStateSerializer,
    AssignmentSerializer,
    AugmentationSerializer,
    CodecSerializer,
    CutTableSerializer,
    HandoffSerializer,
    JobResultsSerializer,
    JobSerializer,
    JobStatusSerializer,
    LossSeriesSerializer,
    MetricPointSerializer,
    ModelModulesSerializer,
    ModeSerializer,
    OptimizersSerializer,
    RegistryModelSerializer,
    TaskSerializer,
    TransitionInputSerializer,
    TurnSerializer,
)
from training.assignment_changes import assignments_version
from training.evaluation import agent_evaluation_problem, evaluation_request
from training.inference import inference_request
from training.leakage import leakage_report
from training.models import Job, MetricPoint, Turn
from training.privacy import privacy_report
from training.states import JobState
from training.validation import (
    CUT_TABLE_MAX_CHANNELS,
    CUT_TABLE_MAX_SIDE,
    CUT_TABLE_MAX_VALUES,
    MAX_PARTICIPANTS,
    JobInput,
)
from training.vertical_prediction import vertical_prediction_request


def _actor(request: Request) -> Actor:
    """The request's actor, worked out once per request."""
    actor = getattr(request, "_medsplit_actor", None)
    if actor is None:
        actor = actor_from_request(request)
        request._medsplit_actor = actor
    return actor


# Schema generation runs list views without a request user; they get an empty queryset.
class _FakeViewMixin:
    def _fake(self) -> bool:
        return getattr(self, "swagger_fake_view", False)

    def get_serializer_context(self) -> dict:
        # Who the answer is for: what of each hospital's part it shows depends on it.
        context = super().get_serializer_context()  # type: ignore[misc]
        if not self._fake():
            context["actor"] = _actor(self.request)  # type: ignore[attr-defined]
        return context


@extend_schema(tags=["models"])
class ModelListView(APIView):
    @extend_schema(
        summary="The models jobs can train",
        responses=RegistryModelSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_models(actor=_actor(request)))


@extend_schema(tags=["models"])
class ModelModulesView(APIView):
    @extend_schema(
        summary="The modules whose MODULE:FACTORY models the coordinator builds "
        "(consortium admins)",
        responses=ModelModulesSerializer,
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_model_modules(actor=_actor(request)))


@extend_schema(tags=["models"])
class ModeListView(APIView):
    @extend_schema(
        summary="The split-learning modes jobs can use",
        responses=ModeSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_modes(actor=_actor(request)))


@extend_schema(tags=["models"])
class CodecListView(APIView):
    @extend_schema(
        summary="The wire codecs jobs can use",
        responses=CodecSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_codecs(actor=_actor(request)))


@extend_schema(tags=["models"])
class TaskListView(APIView):
    @extend_schema(
        summary="The tasks jobs can learn (classification, segmentation), their losses "
        "and validation metric",
        responses=TaskSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_tasks(actor=_actor(request)))


@extend_schema(tags=["models"])
class OptimizerListView(APIView):
    @extend_schema(
        summary="The optimizers and learning-rate schedules a job's parties can use",
        responses=OptimizersSerializer,
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_optimizers(actor=_actor(request)))


@extend_schema(tags=["models"])
class AugmentationListView(APIView):
    @extend_schema(
        summary="The random transforms a job's augmentation can name",
        responses=AugmentationSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.registry_augmentations(actor=_actor(request)))


@extend_schema(tags=["models"])
class ModelCutsView(APIView):
    """Bounded input shapes, a throttle per person, and one cache for every process: a
    new shape costs seconds of CPU (training/validation.py)."""

    throttle_classes = [ScopedThrottle]
    throttle_scope = "cut_table"

    @extend_schema(
        summary="The cut table of a model at an input shape",
        parameters=[
            OpenApiParameter(
                "input_shape",
                str,
                required=False,
                description="channels,height,width[,depth]; default: the model's own. At "
                f"most {CUT_TABLE_MAX_SIDE} per side, {CUT_TABLE_MAX_CHANNELS} channels and "
                f"{CUT_TABLE_MAX_VALUES} values in all",
            ),
            OpenApiParameter(
                "depth",
                int,
                required=False,
                description="list every module boundary at most this many names deep (1 to "
                "16); default: down to the depth where the tensors that cross change",
            ),
            OpenApiParameter(
                "model_args",
                str,
                required=False,
                description="a MODULE:FACTORY model's keyword arguments, a JSON object of at "
                "most 4096 bytes; such a model's table is worked out only when its module is "
                "in MEDSPLIT_MODEL_MODULES, and it needs input_shape",
            ),
        ],
        responses={
            200: CutTableSerializer,
            400: error("invalid, or input_too_large: the message names the limit"),
            429: error("too many cut tables asked for; see Retry-After"),
        },
    )
    def get(self, request: Request, name: str) -> Response:
        table = selectors.registry_model_cuts(
            actor=_actor(request),
            model_name=name,
            input_shape=request.query_params.get("input_shape"),
            depth=request.query_params.get("depth"),
            model_args=request.query_params.get("model_args"),
        )
        return Response(table)


@extend_schema(tags=["jobs"])
class JobListCreateView(_FakeViewMixin, generics.ListAPIView):
    serializer_class = JobSerializer
    filterset_class = JobFilter
    queryset = Job.objects.none()

    def get_queryset(self):
        if self._fake():
            return Job.objects.none()
        return selectors.job_list(actor=_actor(self.request))

    @extend_schema(summary="Jobs you may see (filter by state, model, hospital)")
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Create a job (consortium admins); it starts as a draft",
        request=JobInput,
        responses={201: JobSerializer},
    )
    def post(self, request: Request) -> Response:
        actor = _actor(request)
        job = services.job_create(actor=actor, data=request.data)
        job = selectors.job_get(actor=actor, job_id=job.pk)
        return Response(
            JobSerializer(job, context={"actor": actor}).data, status=status.HTTP_201_CREATED
        )


@extend_schema(tags=["jobs"])
class JobDetailView(APIView):
    @extend_schema(summary="A job's configuration, state and participants", responses=JobSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        job = selectors.job_get(actor=actor, job_id=job_id)
        return Response(JobSerializer(job, context={"actor": actor}).data)


@extend_schema(tags=["jobs"])
class JobStatusView(APIView):
    @extend_schema(
        summary="A small, fast summary of a job's progress", responses=JobStatusSerializer
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(selectors.job_status(actor=_actor(request), job_id=job_id))


@extend_schema(tags=["jobs"])
class JobResultsView(APIView):
    @extend_schema(
        summary="A completed job's final model evaluated at every hospital on its own test "
        "set, through the split: each hospital's figures (yours only, for a hospital admin) "
        "and their mean weighted by test size",
        responses=JobResultsSerializer,
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(selectors.job_results(actor=_actor(request), job_id=job_id))


@extend_schema(tags=["jobs"])
class JobEvaluateView(APIView):
    @extend_schema(
        summary="Evaluate a completed job's final model again at every hospital (consortium "
        "admins)",
        request=None,
        responses={
            202: JobResultsSerializer,
            409: error(
                "the job has not completed, its mode cannot be evaluated through the "
                "split, or an evaluation of it is running"
            ),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        selectors.job_get(actor=actor, job_id=job_id)  # a job the actor cannot see: 404
        evaluation_request(actor=actor, job_id=job_id)
        return Response(
            selectors.job_results(actor=actor, job_id=job_id), status=status.HTTP_202_ACCEPTED
        )


@extend_schema(tags=["jobs"])
class JobTurnsView(_FakeViewMixin, generics.ListAPIView):
    serializer_class = TurnSerializer
    filter_backends: list = []
    queryset = Turn.objects.none()

    def get_queryset(self):
        if self._fake():
            return Turn.objects.none()
        job = selectors.job_get(actor=_actor(self.request), job_id=self.kwargs["job_id"])
        return selectors.job_turns(job=job)

    @extend_schema(summary="A job's turns, in order")
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)


@extend_schema(tags=["jobs"])
class JobMetricsView(_FakeViewMixin, generics.ListAPIView):
    serializer_class = MetricPointSerializer
    filter_backends: list = []
    queryset = MetricPoint.objects.none()

    def get_queryset(self):
        if self._fake():
            return MetricPoint.objects.none()
        job = selectors.job_get(actor=_actor(self.request), job_id=self.kwargs["job_id"])
        turn_id, since = _metrics_params(self.request)
        return selectors.job_metrics(
            actor=_actor(self.request), job=job, turn_id=turn_id, since=since
        )

    @extend_schema(
        summary="A job's metric points over time",
        parameters=[
            OpenApiParameter("turn", int, required=False, description="one turn's points"),
            OpenApiParameter(
                "since",
                OpenApiTypes.DATETIME,
                required=False,
                description="points after this ISO 8601 time (write UTC as Z, or %2B for +)",
            ),
        ],
    )
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)


@extend_schema(tags=["jobs"])
class JobLossSeriesView(APIView):
    @extend_schema(
        summary="A job's training loss, one curve per hospital over the job's steps, with "
        "where each round starts and the steps a turn of each hospital takes",
        responses=LossSeriesSerializer,
    )
    def get(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        job = selectors.job_get(actor=actor, job_id=job_id)
        return Response(selectors.job_loss_series(actor=actor, job=job))


def _metrics_params(request: Request) -> tuple[int | None, datetime | None]:
    problems: dict[str, list[str]] = {}
    turn_id = since = None
    raw_turn = request.query_params.get("turn")
    if raw_turn is not None:
        if raw_turn.isdigit():
            turn_id = int(raw_turn)
        else:
            problems["turn"] = [f"a turn id is a positive integer, got {raw_turn!r}"]
    raw_since = request.query_params.get("since")
    if raw_since is not None:
        try:
            since = parse_datetime(raw_since)
        except ValueError:
            since = None
        if since is None or since.tzinfo is None:
            problems["since"] = [f"give an ISO 8601 time with its offset, got {raw_since!r}"]
    if problems:
        raise InvalidInput("bad metric filters", details=problems)
    return turn_id, since


@extend_schema(tags=["jobs"])
class JobTransitionView(APIView):
    """``POST /api/jobs/{id}/<action>/``: one view, configured with the target state."""

    target: JobState = JobState.SCHEDULED

    @extend_schema(request=TransitionInputSerializer, responses=JobSerializer)
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        body = TransitionInputSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        job = selectors.job_get(actor=actor, job_id=job_id)
        services.job_transition(
            job=job, to=self.target, actor=actor, reason=body.validated_data["reason"]
        )
        job = selectors.job_get(actor=actor, job_id=job_id)
        return Response(JobSerializer(job, context={"actor": actor}).data)


def transition_view(target: JobState, summary: str):
    """The transition view for ``target``, with its own operation in the schema."""
    view = type(
        f"Job{target.value.title()}View",
        (JobTransitionView,),
        {"target": target, "__doc__": summary},
    )
    return extend_schema(summary=summary)(view).as_view()


MAX_WAIT_SECONDS = 30.0


@extend_schema(tags=["agent"])
class AgentAssignmentListView(APIView):
    @extend_schema(
        summary="The calling agent's jobs (scheduled, running, paused, recently ended), "
        "with its turns; long-polls with ?wait=&etag=",
        parameters=[
            OpenApiParameter(
                "wait",
                OpenApiTypes.FLOAT,
                description=f"seconds (at most {MAX_WAIT_SECONDS:g}) to hold the answer "
                "while it still matches `etag`",
            ),
            OpenApiParameter(
                "etag", OpenApiTypes.STR, description="the ETag of the answer already held"
            ),
        ],
        responses={
            200: AssignmentSerializer(many=True),
            429: error("this agent token already has a long-poll waiting; see Retry-After"),
        },
    )
    def get(self, request: Request) -> Response:
        actor = _actor(request)
        require_agent(actor, "read assignments")
        wait = _wait_seconds(request)
        known = request.query_params.get("etag", "")
        # At most one waiting poll per token, and a bounded number per process: beyond
        # it the answer comes at once, as if nothing changed (training/api/long_poll.py).
        with long_poll(token_id=getattr(request.auth, "pk", None), wait=wait) as granted:
            deadline = time.monotonic() + granted
            # Read before the answer is built: a change committed while it is built is
            # then seen as a change, and the answer built again.
            hospital_id = actor.hospital.pk
            seen = assignments_version(hospital_id) if granted else 0
            if granted and ANSWERS_BUILT.holds(hospital_id, seen, known):
                seen = wait_for_change(hospital_id, seen, until=deadline)  # it holds this one
            while True:
                data = AssignmentSerializer(
                    selectors.agent_assignments(actor=actor),
                    many=True,
                    context={"actor": actor},
                ).data
                etag = hashlib.sha256(
                    json.dumps(data, sort_keys=True, default=str).encode()
                ).hexdigest()[:32]
                ANSWERS_BUILT.record(hospital_id, seen, etag)
                if etag != known or time.monotonic() >= deadline:
                    break
                seen = wait_for_change(hospital_id, seen, until=deadline)
        response = Response(data)
        response["ETag"] = etag
        return response


def _wait_seconds(request: Request) -> float:
    text = request.query_params.get("wait", "0")
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise InvalidInput(
            "wait must be a number of seconds",
            details={"wait": [f"between 0 and {MAX_WAIT_SECONDS:g}, got {text!r}"]},
        )
    return wait


class SealedForInputSerializer(StrictSerializer):
    recipient = StrictCharField(max_length=64)
    ciphertext_sha256 = StrictCharField(min_length=64, max_length=64)
    size_bytes = StrictIntegerField(min_value=1)


class HandoffInputSerializer(SealedForInputSerializer):
    turn = StrictIntegerField(min_value=1)


class HandoffsInputSerializer(StrictSerializer):
    turn = StrictIntegerField(min_value=1)
    handoffs = SealedForInputSerializer(
        many=True,
        allow_empty=False,
        max_length=MAX_PARTICIPANTS,
        help_text="one per recipient, each named once",
    )


class LossReportInputSerializer(StrictSerializer):
    turn = StrictIntegerField(min_value=1)
    step = StrictIntegerField(min_value=1, help_text="training steps of the turn done so far")
    loss = serializers.FloatField(help_text="the hospital's training loss at that step")


class ProblemInputSerializer(StrictSerializer):
    turn = StrictIntegerField(min_value=1)
    reason = StrictCharField(max_length=2000)


class SubmissionInputSerializer(StrictSerializer):
    round = StrictIntegerField(min_value=0)
    attempt = StrictIntegerField(min_value=0)
    sha256 = StrictCharField(min_length=64, max_length=64, help_text="of the masked vector's bytes")
    size_bytes = StrictIntegerField(min_value=1)
    counts = serializers.DictField(
        help_text="its integer buffers (BatchNorm's batch counters, public), by name, each a "
        "list of integers; combined by their maximum"
    )


@extend_schema(tags=["agent"])
class AgentSubmissionView(APIView):
    @extend_schema(
        summary="The agent put its masked submission to a secure aggregation round on the "
        "relay: its digest, size and public integer buffers (never the vector)",
        request=SubmissionInputSerializer,
        responses={
            200: AggregationSerializer,
            409: error("the attempt takes no submissions, or another digest was reported"),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "submit to a secure aggregation")
        data = _valid(SubmissionInputSerializer, request)
        aggregation = aggregation_submit(
            actor=actor,
            job_id=job_id,
            round_index=data["round"],
            attempt=data["attempt"],
            sha256=data["sha256"],
            size_bytes=data["size_bytes"],
            counts=data["counts"],
        )
        return Response(AggregationSerializer(aggregation).data)


class AlignmentInputSerializer(StrictSerializer):
    digest = StrictCharField(
        min_length=64, max_length=64, help_text="SHA-256 of the ordered intersection's encoding"
    )
    size = StrictIntegerField(min_value=0, help_text="how many records the intersection holds")


@extend_schema(tags=["agent"])
class AgentAlignmentView(APIView):
    @extend_schema(
        summary="The agent holds its vertical job's intersection of records: its digest and "
        "size (never an identifier); once every party has, the coordinator compares them",
        request=AlignmentInputSerializer,
        responses={200: AlignmentStateSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report a record alignment")
        data = _valid(AlignmentInputSerializer, request)
        alignment = alignment_report(
            actor=actor, job_id=job_id, digest=data["digest"], size=data["size"]
        )
        return Response(AlignmentStateSerializer(alignment_state(alignment.job, alignment)).data)

    @extend_schema(
        summary="The job's record alignment: pending, agreed, mismatch or too small",
        responses={200: AlignmentStateSerializer},
    )
    def get(self, request: Request, job_id: int) -> Response:
        state = alignment_get(actor=_actor(request), job_id=job_id)
        return Response(AlignmentStateSerializer(state).data)


class LeakageInputSerializer(StrictSerializer):
    round = StrictIntegerField(min_value=0, help_text="the round the audit scored")
    parties = serializers.DictField(
        child=serializers.DictField(),
        help_text="by passive party: records, norm_auc and cosine_auc (each in [0, 1] or null)",
    )


@extend_schema(tags=["agent"])
class AgentLeakageView(APIView):
    @extend_schema(
        summary="The label party's label-leakage audit of a round: each passive party's "
        "attack AUCs against the labels (four numbers; no score, gradient or label)",
        request=LeakageInputSerializer,
        responses={200: serializers.ListField(child=serializers.DictField())},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report a label-leakage audit")
        data = _valid(LeakageInputSerializer, request)
        rows = leakage_report(
            actor=actor, job_id=job_id, round_index=data["round"], parties=data["parties"]
        )
        return Response(
            [
                {
                    "round": r.round_index,
                    "hospital": r.hospital.slug,
                    "records": r.records,
                    "norm_auc": r.norm_auc,
                    "cosine_auc": r.cosine_auc,
                }
                for r in rows
            ]
        )


class StrictNumberField(serializers.FloatField):
    """A JSON number (not a boolean or a string), finite; ``null`` where allowed."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if not math.isfinite(data):
            raise serializers.ValidationError("a finite number is required")
        return super().to_internal_value(data)


#: The most bytes a privacy report may take: a few numbers (about 400 bytes in practice).
MAX_PRIVACY_REPORT_BYTES = 4096


def _figure(help_text: str, *, nullable: bool = False) -> serializers.Field:
    return StrictNumberField(required=False, allow_null=nullable, help_text=help_text)


def _count(help_text: str) -> serializers.Field:
    return StrictIntegerField(required=False, min_value=1, help_text=help_text)


class PrivacyReportInputSerializer(StrictSerializer):
    round = StrictIntegerField(min_value=0, help_text="the round whose turn just ended")
    ssim = _figure("inversion: mean SSIM of the rebuilt validation images, in [-1, 1]")
    psnr = _figure("inversion: their mean PSNR in dB, in [0, 200]")
    baseline_ssim = _figure("SSIM of the training images' mean in place of each rebuilt one")
    baseline_psnr = _figure("PSNR (dB) of the training images' mean in their place")
    distance_correlation = _figure("of validation inputs and activations, in [0, 1]")
    train_records = _count("training records the inverse network learnt from")
    val_records = _count("validation records rebuilt")
    label_records = _count("records whose gradients the label-leakage attacks scored")
    norm_auc = _figure(
        "the norm attack's ROC AUC, in [0, 1] (null: labels not binary)", nullable=True
    )
    cosine_auc = _figure("the cosine attack's ROC AUC, in [0, 1] (null: not binary)", nullable=True)
    epsilon = _figure("ε spent so far by the activation noise, over the job to this round")
    delta_total = _figure("the δ that ε holds at, the Poisson redraws' share added, in [0, 1]")
    noise_multiplier = _figure("the activation noise's multiplier in use (σ over the clip norm)")


@extend_schema(tags=["agent"])
class AgentPrivacyView(APIView):
    @extend_schema(
        summary="This hospital's privacy figures of a round: its inversion SSIM and PSNR, "
        "distance correlation, label-leakage AUCs and ε spent (numbers only, about itself)",
        request=PrivacyReportInputSerializer,
        responses={200: serializers.DictField()},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report privacy figures")
        length = request.META.get("CONTENT_LENGTH") or ""
        if not length.isdigit() or int(length) > MAX_PRIVACY_REPORT_BYTES:
            raise InvalidInput(
                f"a privacy report is a few numbers: at most {MAX_PRIVACY_REPORT_BYTES} "
                "bytes, with its Content-Length",
                details={"non_field_errors": ["too large, or no Content-Length"]},
            )
        data = _valid(PrivacyReportInputSerializer, request)
        round_index = data.pop("round")
        row = privacy_report(actor=actor, job_id=job_id, round_index=round_index, figures=data)
        return Response({"round": row.round_index, "hospital": row.hospital.slug})


@extend_schema(tags=["jobs"])
class JobPrivacyView(APIView):
    @extend_schema(
        summary="A job's privacy figures per round and hospital (a hospital admin: their "
        "own hospital's only), with the ε target and δ of its activation noise",
        responses={200: serializers.ListField(child=serializers.DictField())},
    )
    def get(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        job = selectors.job_get(actor=actor, job_id=job_id)
        return Response(selectors.privacy_figures(job, actor))


@extend_schema(tags=["agent"])
class AgentHandoffView(APIView):
    @extend_schema(
        summary="Record the hash and size of the weights the agent sealed for a recipient "
        "after its turn (never the blob)",
        request=HandoffInputSerializer,
        responses={201: HandoffSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "record a hand-off")
        data = _valid(HandoffInputSerializer, request)
        handoff = agent_services.agent_handoff_record(
            actor=actor,
            job_id=job_id,
            turn_id=data["turn"],
            recipient=data["recipient"],
            ciphertext_sha256=data["ciphertext_sha256"],
            size_bytes=data["size_bytes"],
        )
        return Response(HandoffSerializer(handoff).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["agent"])
class AgentHandoffsView(APIView):
    @extend_schema(
        summary="Record the hashes and sizes of the weights the agent sealed for several "
        "recipients after its turn, all or none (never the blobs)",
        request=HandoffsInputSerializer,
        responses={201: HandoffSerializer(many=True)},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "record a hand-off")
        data = _valid(HandoffsInputSerializer, request)
        handoffs = agent_services.agent_handoffs_record(
            actor=actor, job_id=job_id, turn_id=data["turn"], sealed=data["handoffs"]
        )
        return Response(HandoffSerializer(handoffs, many=True).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["agent"])
class AgentProblemView(APIView):
    @extend_schema(
        summary="Give up the agent's running turn: its data cannot be used (the reason "
        "names files, never data); the job's failure policy applies",
        request=ProblemInputSerializer,
        responses={200: TurnSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report a problem")
        data = _valid(ProblemInputSerializer, request)
        turn = agent_services.agent_problem_report(
            actor=actor, job_id=job_id, turn_id=data["turn"], reason=data["reason"]
        )
        return Response(TurnSerializer(turn, context={"actor": actor}).data)


class EvaluationProblemInputSerializer(StrictSerializer):
    evaluation = StrictIntegerField(min_value=1, help_text="the assignment's evaluation id")
    reason = StrictCharField(max_length=2000, help_text="names files, never data")
    no_test_set = serializers.BooleanField(
        default=False, help_text="the agent holds no test set (its status becomes no_test_set)"
    )


@extend_schema(tags=["agent"])
class AgentEvaluationProblemView(APIView):
    @extend_schema(
        summary="The agent cannot take part in its evaluation (no test set, or one it cannot "
        "read); its part of the evaluation ends with the reason",
        request=EvaluationProblemInputSerializer,
        responses={200: OpenApiTypes.OBJECT, 409: error("its evaluation has ended")},
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report an evaluation problem")
        data = _valid(EvaluationProblemInputSerializer, request)
        part = agent_evaluation_problem(
            actor=actor,
            job_id=job_id,
            part_id=data["evaluation"],
            reason=data["reason"],
            no_test_set=data["no_test_set"],
        )
        return Response({"evaluation": part.pk, "status": part.status})


class InferenceInputSerializer(StrictSerializer):
    samples = StrictIntegerField(min_value=1, help_text="the images the agent will send")


@extend_schema(tags=["agent"])
class AgentInferenceView(APIView):
    @extend_schema(
        summary="Predictions of a completed job's final model on the agent's own images, "
        "through the split: the request's round, the serving batch and the stream topic "
        "its activations go up on",
        request=InferenceInputSerializer,
        responses={
            202: OpenApiTypes.OBJECT,
            400: error("no images, or more than the deployment allows in one request"),
            404: error("no such job with this hospital among its participants"),
            409: error("the job has not completed, is vertical, or a request is still open"),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "ask for predictions")
        data = _valid(InferenceInputSerializer, request)
        asked = inference_request(actor=actor, job_id=job_id, samples=data["samples"])
        return Response(
            {
                "request": asked.pk,
                "round": inference_round(asked.pk),
                "position": asked.position,
                "samples": asked.samples,
                "serving_batch": asked.serving_batch,
                "topic": INFERENCE_TOPIC,
                "status": asked.status,
            },
            status=status.HTTP_202_ACCEPTED,
        )


class VerticalPredictionInputSerializer(StrictSerializer):
    records = StrictIntegerField(
        min_value=1, help_text="how many of its records the label party asks about (a count)"
    )


@extend_schema(tags=["agent"])
class AgentVerticalPredictionView(APIView):
    @extend_schema(
        summary="A vertical job's predictions on records its label party names: every "
        "party's agent answers (training/vertical_prediction.py); the label party's part",
        request=VerticalPredictionInputSerializer,
        responses={
            202: OpenApiTypes.OBJECT,
            400: error("no records, or more than the deployment allows in one request"),
            404: error("no such job with this hospital among its participants"),
            409: error(
                "not completed, not vertical, not the label party, a party offline, or an "
                "evaluation or prediction still running"
            ),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "ask for predictions")
        data = _valid(VerticalPredictionInputSerializer, request)
        part = vertical_prediction_request(actor=actor, job_id=job_id, records=data["records"])
        return Response(
            {
                "prediction": part.pk,
                "attempt": part.evaluation.attempt,
                "round": evaluation_round(part.job.rounds, part.evaluation.attempt),
                "position": part.position,
                "records": part.test_samples,
                "status": part.status,
            },
            status=status.HTTP_202_ACCEPTED,
        )


@extend_schema(tags=["agent"])
class AgentProgressView(APIView):
    @extend_schema(
        summary="The agent's training loss at a step of its running turn, in a mode whose "
        "loss is computed at the hospital (U-shaped); one number, about once a second",
        request=LossReportInputSerializer,
        responses={
            200: TurnSerializer,
            409: error("the job's server computes the loss, or the turn is not running"),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        require_agent(actor, "report a training loss")
        data = _valid(LossReportInputSerializer, request)
        turn = agent_services.agent_loss_report(
            actor=actor, job_id=job_id, turn_id=data["turn"], step=data["step"], loss=data["loss"]
        )
        return Response(TurnSerializer(turn, context={"actor": actor}).data)


def _valid(serializer_class: type, request: Request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


@extend_schema(tags=["agent"])
class AgentAssignmentDetailView(APIView):
    @extend_schema(summary="One assignment of the calling agent", responses=AssignmentSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        actor = _actor(request)
        job = selectors.agent_assignment_get(actor=actor, job_id=job_id)
        return Response(AssignmentSerializer(job, context={"actor": actor}).data)
