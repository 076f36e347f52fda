"""Evaluating a completed job's final model at every hospital, through the split: writes.

When a job completes (and again when a consortium admin asks), an :class:`Evaluation`
starts with one :class:`HospitalEvaluation` per participant: one that reported a test set
in its heartbeat (``dataset_summary["split_sizes"]["test"]``) takes an evaluation-only
turn (``medsplit/turns/evaluation.py``: its test batches through its front, and in
U-shaped mode its head, at home; the server segment on a worker, ``workers/
evaluation_runner.py``); one that reported none is marked ``no_test_set``. The worker
records each hospital's figures as its metrics frame gave them, checked first; the audit
log records that an evaluation ran and its sizes, never a figure.

Reads are in :mod:`training.selectors` (``job_results``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from audit.services import audit_record
from kernel.actors import Actor, ActorKind
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent, require_consortium_admin
from medsplit.turns import Directive
from training.dispatch import job_changed_on_commit
from training.models import Evaluation, HospitalEvaluation, Job
from training.states import JobState

#: The figures an evaluation keeps per hospital, by task (``samples`` for every task).
FIGURES: Mapping[str, tuple[str, ...]] = {
    "classification": ("accuracy", "auc", "baseline_accuracy"),
    "segmentation": ("dice",),
}
#: The figures that are shares, in [0, 1].
SHARES = frozenset({"accuracy", "auc", "baseline_accuracy", "dice"})
#: How often one hospital's evaluation may be started (a worker taking it over, the
#: relay or the database away) before it fails saying so.
MAX_RUNS = 3


def evaluation_refusal(job: Job) -> str | None:
    """Why ``job``'s final model cannot be evaluated through the split, in words; ``None``
    when it can (every mode the platform runs can be: a vertical job on its parties'
    aligned test records, ``workers/evaluation_runner.py``)."""
    del job  # kept in the signature: a mode that cannot be evaluated would say so here
    return None


def joint_evaluation(job: Job) -> bool:
    """Whether ``job``'s evaluation is one joint run over every party's aligned test
    records (vertical: parties hold different features of the same patients) rather than
    one per hospital."""
    return bool(job.training_config().split_mode.feature_sets)


def test_size(summary: Mapping[str, Any] | None) -> int:
    """The test set's size a hospital reported in its heartbeat; 0: no test set."""
    sizes = (summary or {}).get("split_sizes")
    value = sizes.get("test") if isinstance(sizes, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    return value


def evaluation_start(*, job: Job, actor: Actor) -> Evaluation:
    """A new evaluation of ``job``'s final model (see the module docstring), dispatched
    once the transaction commits.

    Raises:
        Conflict: the job has not completed, its mode cannot be evaluated through the
            split (vertical), or an evaluation of it is still running.
    """
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state != JobState.COMPLETED:
            raise Conflict(
                f"job {locked.pk} is {locked.state}: only a completed job has a final "
                "model to evaluate"
            )
        refusal = evaluation_refusal(locked)
        if refusal is not None:
            raise Conflict(refusal)
        running = locked.evaluations.filter(status=Evaluation.Status.RUNNING).first()
        if running is not None:
            raise Conflict(
                f"{running.purpose} {running.attempt} of job {locked.pk} is still running; ask "
                "again once it has ended"
            )
        now = timezone.now()
        last = locked.evaluations.aggregate(last=Max("attempt"))["last"] or 0
        evaluation = Evaluation.objects.create(
            job=locked,
            attempt=last + 1,
            requested_by=actor.user if actor.kind == ActorKind.PERSON else None,
            created_at=now,
        )
        sizes: dict[str, int] = {}
        participants = list(locked.participants.select_related("hospital").order_by("position"))
        joint = joint_evaluation(locked)
        # A joint evaluation needs every party's test records: one without leaves none.
        lacking = [
            p.hospital.slug for p in participants if not test_size(p.hospital.dataset_summary)
        ]
        reason = (
            f"a vertical evaluation needs every party's test records; {', '.join(lacking)} "
            "reported none"
            if joint and lacking
            else ""
        )
        for participant in participants:
            hospital = participant.hospital
            size = 0 if reason else test_size(hospital.dataset_summary)
            sizes[hospital.slug] = size
            HospitalEvaluation.objects.create(
                evaluation=evaluation,
                job=locked,
                hospital=hospital,
                position=participant.position,
                status=(
                    HospitalEvaluation.Status.RUNNING
                    if size
                    else HospitalEvaluation.Status.NO_TEST_SET
                ),
                test_samples=size,
                started_at=now if size else None,
                finished_at=None if size else now,
                failure_reason=reason,
            )
        audit_record(
            actor=actor,
            action="evaluation.started",
            target=f"job:{locked.pk}",
            job_id=locked.pk,
            details={
                "attempt": evaluation.attempt,
                "test_samples": {slug: n for slug, n in sizes.items() if n},
                "no_test_set": sorted(slug for slug, n in sizes.items() if not n),
            },
        )
        _end_if_done(evaluation)
        job_changed_on_commit(locked.pk)
    return evaluation


def evaluation_request(*, actor: Actor, job_id: int) -> Evaluation:
    """A consortium admin's request to evaluate job ``job_id`` (again).

    Raises:
        PermissionDenied: not a consortium admin.
        NotFound: no such job.
        Conflict: as :func:`evaluation_start`.
    """
    require_consortium_admin(actor, "evaluate a job")
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"no job {job_id}")
    return evaluation_start(job=job, actor=actor)


def evaluation_on_completion(*, job: Job) -> Evaluation | None:
    """The evaluation a job gets as it completes (inside its transition's transaction):
    none for a mode that cannot be evaluated through the split (the results say why)."""
    if evaluation_refusal(job) is not None:
        return None
    return evaluation_start(job=job, actor=Actor.system())


# -- a worker's side ---------------------------------------------------------------------


def evaluation_claim(
    *, part_id: int, runner: str, lease_seconds: float, now: datetime | None = None
) -> HospitalEvaluation | None:
    """Take hospital evaluation ``part_id`` for ``runner`` unless another runner's lease
    is live; ``None`` when it is not running or is held (a duplicate task)."""
    now = now or timezone.now()
    with transaction.atomic():
        part = (
            HospitalEvaluation.objects.select_for_update()
            .select_related("hospital", "evaluation", "job")
            .filter(pk=part_id)
            .first()
        )
        if part is None or part.status != HospitalEvaluation.Status.RUNNING:
            return None
        live = part.lease_expires_at is not None and part.lease_expires_at > now
        if part.runner and part.runner != runner and live:
            return None
        part.runner = runner
        part.lease_expires_at = now + timedelta(seconds=lease_seconds)
        part.runs += 1
        part.save(update_fields=["runner", "lease_expires_at", "runs"])
    return part


def evaluation_directive(
    *, part_id: int, runner: str, lease_seconds: float, renew: bool
) -> Directive:
    """``run`` while the hospital's evaluation is running and held by ``runner`` (renewing
    the lease when ``renew``), else ``stop``. An evaluation never pauses."""
    held = HospitalEvaluation.objects.filter(
        pk=part_id, runner=runner, status=HospitalEvaluation.Status.RUNNING
    )
    if not held.exists():
        return Directive.STOP
    if renew and not held.update(
        lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds)
    ):
        return Directive.STOP
    return Directive.RUN


def evaluation_release(*, part_id: int, runner: str) -> None:
    """Give the hospital's evaluation up: the next runner need not wait for the lease."""
    HospitalEvaluation.objects.filter(pk=part_id, runner=runner).update(
        runner="", lease_expires_at=None
    )


def evaluation_finish(
    *,
    part: HospitalEvaluation,
    metrics: Mapping[str, float],
    bytes_up: int = 0,
    bytes_down: int = 0,
) -> HospitalEvaluation:
    """Record the figures the hospital's metrics frame gave (named as
    :data:`medsplit.turns.evaluation.RESULT_NAMES`), checked first: the task's figures
    only, shares in [0, 1], ``samples`` the test size the hospital reported. The audit
    log gets the sizes, not the figures. Finishing a completed one again changes nothing.

    Raises:
        InvalidInput: a figure that is not the task's, not finite or out of range, or a
            sample count other than the reported test size.
        Conflict: the hospital's evaluation failed meanwhile.
    """
    task = part.job.job_description().task
    figures = _checked_figures(task, metrics, part.test_samples)
    with transaction.atomic():
        locked = HospitalEvaluation.objects.select_for_update().get(pk=part.pk)
        if locked.status == HospitalEvaluation.Status.COMPLETED:
            return locked
        if locked.status != HospitalEvaluation.Status.RUNNING:
            raise Conflict(f"the evaluation at {part.hospital.slug} is {locked.status}")
        locked.status = HospitalEvaluation.Status.COMPLETED
        locked.metrics = figures
        locked.bytes_up, locked.bytes_down = bytes_up, bytes_down
        locked.finished_at = timezone.now()
        locked.runner, locked.lease_expires_at = "", None
        locked.save()
        audit_record(
            actor=Actor.system(),
            action="evaluation.hospital_completed",
            target=f"job:{part.job_id}",
            hospital=part.hospital.slug,
            job_id=part.job_id,
            details={
                "attempt": part.evaluation.attempt,
                "test_samples": part.test_samples,
                "bytes_up": bytes_up,
                "bytes_down": bytes_down,
            },
        )
        _end_if_done(locked.evaluation)
    return locked


def evaluation_finish_joint(
    *,
    parts: list[HospitalEvaluation],
    label_part: HospitalEvaluation,
    metrics: Mapping[str, float],
    records: int,
    bytes_up: Mapping[int, int],
    bytes_down: Mapping[int, int],
) -> None:
    """Record a joint (vertical) evaluation: the figures, checked as
    :func:`evaluation_finish` checks them, at the label party's part, over the ``records``
    aligned test records (no more than any party reported); every other party's part
    completes with the size alone (its front took part; the labels are not its own), so
    the weighted means are the label party's figures.

    Raises:
        InvalidInput: figures that are not the task's or not possible, or more records
            than a party reported.
        Conflict: a part failed meanwhile.
    """
    task = label_part.job.job_description().task
    smallest = min(p.test_samples for p in parts)
    if not 1 <= records <= smallest:
        raise InvalidInput(
            f"{records} aligned test records; the parties reported at most {smallest}"
        )
    figures = _checked_figures(task, metrics, records)
    complete_joint(
        parts=parts,
        figures={label_part.pk: figures},
        records=records,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        action="evaluation.hospital_completed",
    )


def complete_joint(
    *,
    parts: list[HospitalEvaluation],
    figures: Mapping[int, Mapping[str, float]],
    records: int,
    bytes_up: Mapping[int, int],
    bytes_down: Mapping[int, int],
    action: str,
) -> None:
    """Every part of a joint pass (a vertical evaluation or prediction) completed over
    ``records`` aligned records, ``figures`` at the parts that have any, audited as
    ``action`` with the sizes only.

    Raises:
        Conflict: a part ended meanwhile.
    """
    with transaction.atomic():
        locked = list(
            HospitalEvaluation.objects.select_for_update()
            .select_related("evaluation", "hospital")
            .filter(pk__in=[p.pk for p in parts])
            .order_by("position")
        )
        ended = [p for p in locked if p.status != HospitalEvaluation.Status.RUNNING]
        if ended:
            raise Conflict(f"the evaluation at {ended[0].hospital.slug} is {ended[0].status}")
        now = timezone.now()
        for part in locked:
            part.status = HospitalEvaluation.Status.COMPLETED
            part.metrics = dict(figures.get(part.pk, {}))
            part.test_samples = records
            part.bytes_up, part.bytes_down = bytes_up.get(part.pk, 0), bytes_down.get(part.pk, 0)
            part.finished_at = now
            part.runner, part.lease_expires_at = "", None
            part.save()
            audit_record(
                actor=Actor.system(),
                action=action,
                target=f"job:{part.job_id}",
                hospital=part.hospital.slug,
                job_id=part.job_id,
                details={
                    "attempt": part.evaluation.attempt,
                    "test_samples": records,
                    "bytes_up": part.bytes_up,
                    "bytes_down": part.bytes_down,
                    "joint": True,
                },
            )
        _end_if_done(locked[0].evaluation)


def evaluation_fail(
    *, part: HospitalEvaluation, reason: str, status: str = HospitalEvaluation.Status.FAILED
) -> HospitalEvaluation:
    """End the hospital's evaluation without figures: failed (``reason`` says why and
    whose fault), or ``no_test_set`` (its agent holds none after all). A part already
    ended is returned as it is."""
    with transaction.atomic():
        locked = (
            HospitalEvaluation.objects.select_for_update()
            .select_related("evaluation", "hospital")
            .get(pk=part.pk)
        )
        if locked.status != HospitalEvaluation.Status.RUNNING:
            return locked
        locked.status = status
        locked.failure_reason = reason[:2000]
        locked.finished_at = timezone.now()
        locked.runner, locked.lease_expires_at = "", None
        locked.save()
        audit_record(
            actor=Actor.system(),
            action=f"{locked.evaluation.purpose}.hospital_failed"
            if status == HospitalEvaluation.Status.FAILED
            else "evaluation.no_test_set",
            target=f"job:{locked.job_id}",
            hospital=locked.hospital.slug,
            job_id=locked.job_id,
            details={"attempt": locked.evaluation.attempt, "reason": reason[:500]},
        )
        _end_if_done(locked.evaluation)
    return locked


def agent_evaluation_problem(
    *, actor: Actor, job_id: int, part_id: int, reason: str, no_test_set: bool = False
) -> HospitalEvaluation:
    """The agent cannot take part in its evaluation (its test set cannot be read, or it
    holds none): the hospital's evaluation ends with that reason.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such evaluation of this agent's hospital in job ``job_id``.
        Conflict: it has ended already.
    """
    require_agent(actor, "report an evaluation problem")
    part = (
        HospitalEvaluation.objects.select_related("evaluation", "hospital", "job")
        .filter(pk=part_id, job_id=job_id, hospital=actor.hospital)
        .first()
    )
    if part is None:
        raise NotFound(f"no evaluation {part_id} of yours in job {job_id}")
    if part.status != HospitalEvaluation.Status.RUNNING:
        raise Conflict(f"your evaluation {part_id} is {part.status}")
    status = (
        HospitalEvaluation.Status.NO_TEST_SET if no_test_set else HospitalEvaluation.Status.FAILED
    )
    return evaluation_fail(part=part, reason=f"the hospital's agent: {reason}", status=status)


def evaluation_dispatched(*, part_id: int) -> None:
    """A runner task was sent for the hospital's evaluation (the sweep waits a lease)."""
    HospitalEvaluation.objects.filter(pk=part_id).update(dispatched_at=timezone.now())


def evaluations_to_run(*, job_id: int | None = None, now: datetime | None = None) -> list[int]:
    """Running hospital evaluations (of ``job_id``, or every job) that no live runner
    holds and that were not sent to a worker within the last lease period."""
    now = now or timezone.now()
    grace = now - timedelta(seconds=settings.MEDSPLIT["TURN_LEASE_SECONDS"])
    rows = HospitalEvaluation.objects.filter(status=HospitalEvaluation.Status.RUNNING)
    if job_id is not None:
        rows = rows.filter(job_id=job_id)
    return list(
        rows.filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .filter(Q(dispatched_at__isnull=True) | Q(dispatched_at__lte=grace))
        .values_list("pk", flat=True)
    )


# -- helpers ---------------------------------------------------------------------------


def _end_if_done(evaluation: Evaluation) -> None:
    if evaluation.parts.filter(status=HospitalEvaluation.Status.RUNNING).exists():
        return
    Evaluation.objects.filter(pk=evaluation.pk, status=Evaluation.Status.RUNNING).update(
        status=Evaluation.Status.COMPLETED, finished_at=timezone.now()
    )


def _checked_figures(task: str, metrics: Mapping[str, float], test_samples: int) -> dict:
    allowed = {*FIGURES.get(task, ()), "samples"}
    unknown = sorted(set(metrics) - allowed)
    if unknown:
        raise InvalidInput(f"a {task} evaluation reports {sorted(allowed)}, not {unknown}")
    out: dict[str, float | int] = {}
    for name, value in metrics.items():
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise InvalidInput(f"{name} must be a finite number, got {value!r}")
        if name in SHARES and not 0.0 <= value <= 1.0:
            raise InvalidInput(f"{name} must lie in [0, 1], got {value!r}")
        out[name] = float(value)
    if out.get("samples") != test_samples:
        raise InvalidInput(
            f"the evaluation scored {out.get('samples')!r} samples; the hospital reported "
            f"a test set of {test_samples}"
        )
    out["samples"] = test_samples
    return out
