"""Reads of the training app, with who may see what.

Consortium admins, observers and the system see every job; a hospital admin sees only
the jobs their hospital takes part in. A job an actor may not see does not exist for it:
:func:`job_get` answers ``NotFound``, never ``PermissionDenied``. A hospital's agent reads
only its own assignments (:func:`agent_assignments`); the job endpoints are for people.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from kernel.actors import Actor, ActorKind, Role
from kernel.errors import InvalidInput, NotFound
from kernel.permissions import (
    require_agent,
    require_consortium_admin,
    require_person,
    require_person_with_role,
    sees_participant_in_full,
)
from medsplit.errors import UnknownModelError
from medsplit.models import is_factory_name, model_modules
from medsplit.models.registry import get_model_spec, model_names
from medsplit.modes import MODES
from medsplit.protocol.optim import describe_optimizers
from medsplit.training.augment import describe_augmentations
from medsplit.training.schedule import turn_length
from medsplit.training.tasks import TASKS
from medsplit.wire.codecs import describe_codecs
from training.apps import MODEL_MODULES_SETTING
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
from training.privacy import privacy_rows
from training.states import ASSIGNED, TERMINAL, JobState
from training.validation import (
    model_cut_table,
    parse_depth,
    parse_factory_args,
    parse_input_shape,
)


def _sees_all(actor: Actor) -> bool:
    return (
        actor.is_system
        or actor.is_consortium_admin
        or (actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER)
    )


def _require_reader(actor: Actor) -> None:
    """People with a role (and the system) read jobs and the registry; agents do not."""
    require_person_with_role(actor)
    require_person(actor)


def jobs_visible_to(*, actor: Actor) -> QuerySet[Job]:
    """The jobs ``actor`` may see, newest first.

    Raises:
        PermissionDenied: a person without a role, or an agent.
    """
    _require_reader(actor)
    jobs = Job.objects.all()
    if _sees_all(actor):
        return jobs
    if actor.hospital is None:
        return jobs.none()
    # One row per job: a hospital takes part in a job at most once.
    return jobs.filter(participants__hospital=actor.hospital)


def job_list(*, actor: Actor) -> QuerySet[Job]:
    """Jobs for a list view, participants prefetched in order."""
    return (
        jobs_visible_to(actor=actor)
        .select_related("created_by")
        .prefetch_related(_participants_prefetch())
    )


def job_get(*, actor: Actor, job_id: int) -> Job:
    """One job the actor may see, with its participants and current turn.

    Raises:
        NotFound: no such job, or one the actor may not see.
    """
    job = (
        jobs_visible_to(actor=actor)
        .select_related("created_by")
        .prefetch_related(_participants_prefetch())
        .filter(pk=job_id)
        .first()
    )
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def _participants_prefetch() -> Prefetch:
    return Prefetch(
        "participants",
        queryset=JobParticipant.objects.select_related("hospital").order_by("position"),
    )


def job_status(*, actor: Actor, job_id: int) -> dict[str, Any]:
    """A small summary of a job's progress, in two indexed queries.

    What of each hospital's part it shows follows the least-privilege rule
    (:func:`kernel.permissions.sees_participant_in_full`): of another hospital's current
    turn, a hospital admin gets its place, state and sample count only (no steps, bytes
    or loss), and the totals cover the turns they see in full.

    Returns:
        state, current round and turn (with its hospital and counters), totals of the
        turns so far and the last loss.
    """
    job = (
        jobs_visible_to(actor=actor)
        .select_related("current_turn__hospital")
        .filter(pk=job_id)
        .first()
    )
    if job is None:
        raise NotFound(f"no job {job_id}")
    counted = Turn.objects.filter(job_id=job.pk)
    if not _sees_all(actor):
        counted = counted.filter(hospital_id=getattr(actor.hospital, "pk", None))
    totals = counted.aggregate(
        steps=Sum("steps"), samples=Sum("samples"), bytes_up=Sum("bytes_up"),
        bytes_down=Sum("bytes_down"),
    )  # fmt: skip
    turn = job.current_turn
    full = turn is not None and sees_participant_in_full(actor, turn.hospital_id)
    return {
        "id": job.pk,
        "state": job.state,
        "state_changed_at": job.state_changed_at,
        "rounds": job.rounds,
        "round": job.current_round,
        "turn": None if turn is None else _status_turn(turn, full=full),
        "hospital": turn.hospital.slug if turn is not None else None,
        "totals": {name: value or 0 for name, value in totals.items()},
        "last_loss": turn.last_loss if full else None,
    }


def _status_turn(turn: Turn, *, full: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "id": turn.pk,
        "position": turn.position,
        "attempt": turn.attempt,
        "status": turn.status,
        "hospital": turn.hospital.slug,
        "samples": turn.samples,
    }
    if full:
        shown.update(steps=turn.steps, bytes_up=turn.bytes_up, bytes_down=turn.bytes_down)
    return shown


def job_turns(*, job: Job) -> QuerySet[Turn]:
    """A job's turns in the order they were taken: round, position, attempt."""
    return (
        Turn.objects.filter(job=job)
        .select_related("hospital", "round")
        .order_by("round__index", "position", "attempt")
    )


def job_metrics(
    *, actor: Actor, job: Job, turn_id: int | None = None, since: datetime | None = None
) -> QuerySet[MetricPoint]:
    """A job's metric points in time order, of one turn and after ``since`` if given.

    A hospital admin gets the points of their own hospital's turns only (per-step losses
    are part of what only that hospital sees: :mod:`kernel.permissions`).

    Raises:
        InvalidInput: ``turn_id`` is not a turn of this job.
    """
    points = MetricPoint.objects.filter(job=job)
    if not _sees_all(actor):
        points = points.filter(turn__hospital_id=getattr(actor.hospital, "pk", None))
    if turn_id is not None:
        if not Turn.objects.filter(job=job, pk=turn_id).exists():
            raise InvalidInput(
                f"job {job.pk} has no turn {turn_id}",
                details={"turn": [f"job {job.pk} has no turn {turn_id}"]},
            )
        points = points.filter(turn_id=turn_id)
    if since is not None:
        points = points.filter(time__gt=since)
    return points.order_by("time", "id")


#: The most points of one hospital's loss curve an answer holds: a 20-round job of 10
#: hospitals stays a few thousand points, readable and quick to draw.
LOSS_SERIES_MAX_POINTS = 400


def job_loss_series(*, actor: Actor, job: Job) -> dict[str, Any]:
    """The training loss of a job as one curve per hospital over the job's steps.

    The job's step axis counts every training step of the job in order: the turns of a
    round's groups one after another (a parallel group's turns side by side, the group as
    long as its longest turn), so a hospital's turns in successive rounds join into one
    curve, and each round starts at a known step. Of each place (round, position) the
    completed attempt counts, or else the latest. Where the loss is computed (the job
    mode's ``labels``) says whose it is: the worker's, or the one the hospital reported.

    A hospital admin gets the curve and the turn length of their own hospital only (the
    others' split sizes are theirs); another hospital's turn then counts on the axis as the
    steps its sample count makes (what they see of it).

    Returns:
        ``{"loss_from", "total_steps", "rounds": [{"round", "start"}], "turn_steps":
        {slug: steps per turn, or None: not reported, or not yours to see}, "series":
        [{"hospital", "points": [[x, loss]]}]}``.
    """
    config = job.training_config()
    participants = list(job.participants.select_related("hospital").order_by("position"))
    all_sees = _sees_all(actor)
    turns = list(job_turns(job=job))
    chosen: dict[tuple[int, int], Turn] = {}
    for turn in turns:  # in round, position, attempt order: a later attempt replaces
        key = (turn.round.index, turn.position)
        if chosen.get(key) is None or chosen[key].status != Turn.Status.COMPLETED:
            chosen[key] = turn

    def length(turn: Turn) -> int:
        if all_sees or sees_participant_in_full(actor, turn.hospital_id):
            return turn.steps
        return -(-turn.samples // config.batch_size)

    offsets: dict[int, int] = {}
    rounds: list[dict[str, int]] = []
    cursor = 0
    groups: dict[tuple[int, int], list[Turn]] = {}
    for turn in chosen.values():
        groups.setdefault((turn.round.index, turn.group), []).append(turn)
    for (round_index, _), members in sorted(groups.items()):
        if not rounds or rounds[-1]["round"] != round_index:
            rounds.append({"round": round_index, "start": cursor})
        for turn in members:
            offsets[turn.pk] = cursor
        cursor += max(length(t) for t in members)

    points = MetricPoint.objects.filter(turn_id__in=offsets, loss__isnull=False)
    if not all_sees:
        points = points.filter(turn__hospital_id=getattr(actor.hospital, "pk", None))
    slug_of = {t.pk: t.hospital.slug for t in chosen.values()}
    curves: dict[str, list[list[float]]] = {}
    for turn_id, step, loss in points.order_by("turn_id", "step").values_list(
        "turn_id", "step", "loss"
    ):
        curves.setdefault(slug_of[turn_id], []).append([offsets[turn_id] + step, loss])
    series = []
    for p in participants:
        curve = sorted(curves.get(p.hospital.slug, []))
        if len(curve) > LOSS_SERIES_MAX_POINTS:  # evenly thinned, the last point kept
            stride = len(curve) / LOSS_SERIES_MAX_POINTS
            curve = [curve[int(i * stride)] for i in range(LOSS_SERIES_MAX_POINTS - 1)] + [
                curve[-1]
            ]
        if all_sees or sees_participant_in_full(actor, p.hospital_id):
            series.append({"hospital": p.hospital.slug, "points": curve})
    return {
        "loss_from": MODES[job.mode].labels.value if job.mode in MODES else None,
        "total_steps": cursor,
        "rounds": rounds,
        "turn_steps": {
            p.hospital.slug: (
                _turn_steps(config, p.hospital)
                if all_sees or sees_participant_in_full(actor, p.hospital_id)
                else None
            )
            for p in participants
        },
        "series": series,
    }


def _turn_steps(config: Any, hospital: Any) -> int | None:
    """Steps one turn of ``hospital`` takes: its reported training split, the job's batch
    size, local epochs, step limit and ``drop_last`` (None before it reported sizes)."""
    sizes = (hospital.dataset_summary or {}).get("split_sizes")
    train = sizes.get("train") if isinstance(sizes, dict) else None
    if not isinstance(train, int) or isinstance(train, bool) or train < 0:
        return None
    return turn_length(config, train)


#: How long a finished job stays among its participants' assignments: they fetch the
#: final weights meanwhile.
FINISHED_ASSIGNMENT_DAYS = 7


def agent_assignments(*, actor: Actor) -> QuerySet[Job]:
    """The jobs the acting agent's hospital takes part in: scheduled, running or paused,
    and those that ended in the last :data:`FINISHED_ASSIGNMENT_DAYS` days.

    Each job carries ``my_participation`` (its place in the order), ``my_turns`` (its
    turns, latest last), ``all_participants`` (with their hospitals), ``completed_turns``
    (the job's, in order), ``handoffs_to_me``, ``all_aggregations`` (its secure
    aggregation attempts, in order) and ``my_evaluations`` (its parts in the job's
    evaluations, latest last).

    Raises:
        PermissionDenied: the actor is not a hospital's agent.
    """
    require_agent(actor, "read assignments")
    hospital = actor.hospital
    recent = timezone.now() - timedelta(days=FINISHED_ASSIGNMENT_DAYS)
    return (
        Job.objects.filter(participants__hospital=hospital)
        .filter(
            Q(state__in=[*ASSIGNED, JobState.PAUSED])
            | Q(state__in=list(TERMINAL), finished_at__gte=recent)
        )
        .prefetch_related(
            Prefetch(
                "participants",
                queryset=JobParticipant.objects.select_related("hospital").order_by("position"),
                to_attr="all_participants",
            ),
            Prefetch(
                "turns",
                queryset=Turn.objects.filter(status=Turn.Status.COMPLETED)
                .select_related("hospital", "round")
                .order_by("round__index", "position"),
                to_attr="completed_turns",
            ),
            Prefetch(
                "handoffs",
                queryset=HandOff.objects.filter(recipient=hospital),
                to_attr="handoffs_to_me",
            ),
            Prefetch(
                "participants",
                queryset=JobParticipant.objects.filter(hospital=hospital).select_related(
                    "hospital"
                ),
                to_attr="my_participation",
            ),
            Prefetch(
                "aggregations",
                queryset=Aggregation.objects.order_by("round_index", "group", "attempt"),
                to_attr="all_aggregations",
            ),
            Prefetch(
                "turns",
                queryset=Turn.objects.filter(hospital=hospital)
                .select_related("round")
                .order_by("round__index", "attempt"),
                to_attr="my_turns",
            ),
            Prefetch(
                "hospital_evaluations",
                queryset=HospitalEvaluation.objects.filter(hospital=hospital)
                .select_related("evaluation", "job")
                .order_by("evaluation__attempt"),
                to_attr="my_evaluations",
            ),
        )
        .order_by("id")
    )


def agent_assignment_get(*, actor: Actor, job_id: int) -> Job:
    """One assignment of the acting agent; another hospital's job is ``NotFound``."""
    job = agent_assignments(actor=actor).filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"no assignment for job {job_id}")
    return job


def registry_models(*, actor: Actor) -> list[dict[str, Any]]:
    """What the model registry offers, for the dashboard's job form."""
    _require_reader(actor)
    rows = []
    for name in model_names():
        spec = get_model_spec(name)
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "default_input_shape": list(spec.default_input_shape),
                "default_cut": spec.default_cut,
                "tasks": list(spec.tasks),
                # Each mode picks its own from the model's data.
                "default_cuts": {
                    name: list(mode.default_cuts(spec)) for name, mode in MODES.items()
                },
            }
        )
    return rows


def registry_model_modules(*, actor: Actor) -> dict[str, Any]:
    """The modules whose ``MODULE:FACTORY`` models this coordinator builds
    (``MEDSPLIT["MODEL_MODULES"]``) and the setting that lists them, for the job form.
    Consortium admins only: the ones who may create jobs.

    Raises:
        PermissionDenied: anyone else.
    """
    require_consortium_admin(actor, "read the coordinator's model modules")
    return {"modules": list(model_modules().modules), "setting": MODEL_MODULES_SETTING}


def registry_modes(*, actor: Actor) -> list[dict[str, Any]]:
    """The split-learning modes jobs can use, as each describes itself, for the job form."""
    _require_reader(actor)
    return [mode.describe().to_json() for mode in MODES.values()]


def registry_codecs(*, actor: Actor) -> list[dict[str, Any]]:
    """The wire codecs a job can use (name, whether exact, one line), for the job form."""
    _require_reader(actor)
    return describe_codecs()


def registry_tasks(*, actor: Actor) -> list[dict[str, Any]]:
    """The tasks a job can learn, their losses and validation metric, for the job form."""
    _require_reader(actor)
    return [task.to_json() for task in TASKS.values()]


def registry_optimizers(*, actor: Actor) -> dict[str, Any]:
    """The optimizers and schedules a job's parties can use, with their options and
    defaults, for the job form."""
    _require_reader(actor)
    return describe_optimizers()


def registry_augmentations(*, actor: Actor) -> list[dict[str, Any]]:
    """The random transforms a job's augmentation can name, with their parameters'
    defaults, for the job form."""
    _require_reader(actor)
    return describe_augmentations()


def registry_model_cuts(
    *,
    actor: Actor,
    model_name: str,
    input_shape: str | None,
    depth: str | None = None,
    model_args: str | None = None,
) -> dict[str, Any]:
    """The cut table of a model at ``input_shape`` (``"1,28,28"``; default: a registry
    model's own default input shape; a factory has none), ``depth`` names deep (default:
    down to where the tensors that cross change). A ``MODULE:FACTORY`` model takes
    ``model_args`` (JSON) and is worked out only when ``MEDSPLIT["MODEL_MODULES"]`` lists
    its module.

    Raises:
        NotFound: no such registry model.
        InvalidInput: the shape or the arguments are malformed, a factory is not listed
            or has no shape given, or the model does not run on the shape.
    """
    _require_reader(actor)
    args = parse_factory_args(model_args)
    if is_factory_name(model_name):
        if input_shape is None:
            raise InvalidInput(
                "a MODULE:FACTORY model has no default input shape",
                details={"input_shape": ["required for a MODULE:FACTORY model"]},
            )
        name, shape = model_name, parse_input_shape(input_shape)
    else:
        try:
            spec = get_model_spec(model_name)
        except UnknownModelError as e:
            raise NotFound(str(e)) from None
        if args:
            raise InvalidInput(
                "a registry model takes no model_args",
                details={"model_args": [f"{spec.name} is a registry model: it takes none"]},
            )
        name = spec.name
        shape = spec.default_input_shape if input_shape is None else parse_input_shape(input_shape)
    rows = model_cut_table(
        model_name=name, input_shape=tuple(shape), depth=parse_depth(depth), model_args=args
    )
    return {"model": name, "input_shape": list(shape), "cuts": rows}


# -- a job's results: its final model evaluated at every hospital -----------------------

#: How the mean across hospitals is labelled wherever it is shown: it is not a pooled
#: figure (an AUC of all test sets together would need every prediction in one place).
WEIGHTED_MEAN_LABEL = "mean of the hospitals' figures weighted by their test-set sizes (not pooled)"


def job_results(*, actor: Actor, job_id: int) -> dict[str, Any]:
    """The latest evaluation of job ``job_id``'s final model (``GET /api/jobs/{id}/results/``):
    each hospital's figures on its own test set, and their mean weighted by test size.

    Least privilege (:mod:`kernel.permissions`): a hospital admin sees their own
    hospital's figures, test size and failure reason, of the other participants only
    their name, position and their evaluation's status, and the weighted means (without
    the total test size); consortium admins, observers and the system see everything.

    Raises:
        NotFound: no such job, or one the actor may not see.
    """
    from training.evaluation import FIGURES, evaluation_refusal

    job = job_get(actor=actor, job_id=job_id)
    task = job.job_description().task
    figures = FIGURES.get(task, ())
    evaluation = (
        job.evaluations.filter(purpose=Evaluation.Purpose.EVALUATION)
        .select_related("requested_by")
        .order_by("-attempt")
        .first()
    )
    parts = (
        list(evaluation.parts.select_related("hospital").order_by("position"))
        if evaluation is not None
        else []
    )
    everyone = _sees_all(actor)
    hospitals = []
    for part in parts:
        entry: dict[str, Any] = {
            "hospital": part.hospital.slug,
            "name": part.hospital.name,
            "position": part.position,
            "status": part.status,
        }
        if sees_participant_in_full(actor, part.hospital_id):
            entry.update(
                {
                    "test_samples": part.test_samples,
                    **{name: part.metrics.get(name) for name in figures},
                    "reason": part.failure_reason,
                    "bytes_up": part.bytes_up,
                    "bytes_down": part.bytes_down,
                    "finished_at": part.finished_at,
                }
            )
        hospitals.append(entry)
    refusal = evaluation_refusal(job)
    return {
        "job": job.pk,
        "task": task,
        "figures": list(figures),
        "evaluable": refusal is None,
        "refusal": refusal or "",
        "evaluation": None
        if evaluation is None
        else {
            "attempt": evaluation.attempt,
            "status": evaluation.status,
            "started_at": evaluation.created_at,
            "finished_at": evaluation.finished_at,
            "requested_by": evaluation.requested_by.get_username()
            if evaluation.requested_by is not None
            else None,
        },
        "hospitals": hospitals,
        "weighted_mean": _weighted_mean(parts, figures, totals=everyone),
    }


def _weighted_mean(parts: list, figures: tuple[str, ...], *, totals: bool) -> dict | None:
    """Each figure's mean over the hospitals that measured it, weighted by their test
    sizes (an AUC is left out where a hospital's test set lacks a class); ``None`` before
    any hospital's figures came."""
    done = [p for p in parts if p.status == "completed"]
    if not done:
        return None
    # A vertical evaluation's passive parties complete without figures of their own:
    # the joint figures are the label party's, counted once.
    scored = [p for p in done if p.metrics] or done
    mean: dict[str, Any] = {"label": WEIGHTED_MEAN_LABEL, "hospitals": len(scored)}
    if totals:
        mean["test_samples"] = sum(p.test_samples for p in scored)
    for name in figures:
        have = [p for p in done if isinstance(p.metrics.get(name), int | float)]
        weight = sum(p.test_samples for p in have)
        mean[name] = (
            sum(p.test_samples * p.metrics[name] for p in have) / weight if weight else None
        )
        if totals and len(have) != len(scored):
            mean.setdefault("without", {})[name] = sorted(
                p.hospital.slug for p in scored if p not in have
            )
    return mean


def privacy_figures(job: Job, actor: Actor) -> list[dict[str, Any]]:
    """The privacy figures of ``job`` (one ``actor`` sees: :func:`job_get`) that ``actor``
    may see, per round and hospital: each hospital's are part of what only that hospital
    sees in full (:mod:`kernel.permissions`), so a hospital admin gets their own hospital's
    only; consortium admins, observers and the system get every hospital's.

    Returns:
        ``[{"round", "hospital", "ssim", "psnr", "baseline_ssim", "baseline_psnr",
        "distance_correlation", "train_records", "val_records", "label_records",
        "norm_auc", "cosine_auc", "epsilon", "target_epsilon", "delta", "reported_at"}]``,
        by round then hospital; a figure not measured in that round is ``None``.

    Raises:
        PermissionDenied: a person without a role, or an agent.
    """
    _require_reader(actor)
    if _sees_all(actor):
        return privacy_rows(job, hospital_ids=None)
    own = getattr(actor.hospital, "pk", None)
    if own is None or not sees_participant_in_full(actor, own):
        return []
    return privacy_rows(job, hospital_ids={own})
