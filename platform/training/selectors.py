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
    require_person,
    require_person_with_role,
    sees_participant_in_full,
)
from medsplit.errors import UnknownModelError
from medsplit.models.registry import get_model_spec, model_names
from medsplit.modes import MODES
from medsplit.protocol.optim import describe_optimizers
from medsplit.wire.codecs import describe_codecs
from training.models import HandOff, Job, JobParticipant, MetricPoint, Turn
from training.states import ASSIGNED, TERMINAL, JobState
from training.validation import model_cut_table, parse_input_shape


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


#: How long a finished job stays among its participants' assignments: they fetch the
#: final weights meanwhile.
FINISHED_ASSIGNMENT_DAYS = 7


def agent_assignments(*, actor: Actor) -> QuerySet[Job]:
    """The jobs the acting agent's hospital takes part in: scheduled, running or paused,
    and those that ended in the last :data:`FINISHED_ASSIGNMENT_DAYS` days.

    Each job carries ``my_participation`` (its place in the order), ``my_turns`` (its
    turns, latest last), ``all_participants`` (with their hospitals), ``completed_turns``
    (the job's, in order) and ``handoffs_to_me``.

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
                queryset=JobParticipant.objects.filter(hospital=hospital),
                to_attr="my_participation",
            ),
            Prefetch(
                "turns",
                queryset=Turn.objects.filter(hospital=hospital)
                .select_related("round")
                .order_by("round__index", "attempt"),
                to_attr="my_turns",
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
                # Each mode picks its own from the model's data.
                "default_cuts": {
                    name: list(mode.default_cuts(spec)) for name, mode in MODES.items()
                },
            }
        )
    return rows


def registry_modes(*, actor: Actor) -> list[dict[str, Any]]:
    """The split-learning modes jobs can use, as each describes itself, for the job form."""
    _require_reader(actor)
    return [mode.describe().to_json() for mode in MODES.values()]


def registry_codecs(*, actor: Actor) -> list[dict[str, Any]]:
    """The wire codecs a job can use (name, whether exact, one line), for the job form."""
    _require_reader(actor)
    return describe_codecs()


def registry_optimizers(*, actor: Actor) -> dict[str, Any]:
    """The optimizers and schedules a job's parties can use, with their options and
    defaults, for the job form."""
    _require_reader(actor)
    return describe_optimizers()


def registry_model_cuts(
    *, actor: Actor, model_name: str, input_shape: str | None
) -> dict[str, Any]:
    """The cut table of a registry model at ``input_shape`` (``"1,28,28"``; default: the
    model's own default input shape).

    Raises:
        NotFound: no such model.
        InvalidInput: the shape is malformed, or the model does not run on it.
    """
    _require_reader(actor)
    try:
        spec = get_model_spec(model_name)
    except UnknownModelError as e:
        raise NotFound(str(e)) from None
    shape = spec.default_input_shape if input_shape is None else parse_input_shape(input_shape)
    return {
        "model": spec.name,
        "input_shape": list(shape),
        "cuts": model_cut_table(model_name=spec.name, input_shape=tuple(shape)),
    }
