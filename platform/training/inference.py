"""Split inference of a completed job's final model, asked for by a hospital's agent:
writes.

An agent asks for predictions on ``samples`` of its own images (``POST
/api/agent/assignments/{job}/inference/``); the coordinator accepts a request only from
an agent of a hospital that took part in the job, once the job has completed, in a mode
that predicts through one hospital's front (not vertical: :func:`inference_refusal`), at
most one open request per hospital and job, and no more images than
``MEDSPLIT["INFERENCE_MAX_SAMPLES"]``. A worker on the ``INFERENCE_QUEUE`` serves it
(``workers/inference_runner.py``, the core's ``medsplit/turns/inference.py``) and
records how it ended. The audit log records each request and its end as counts and
sizes, never a value.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent
from training.dispatch import inference_requested_on_commit
from training.models import InferenceRequest, Job, JobParticipant
from training.states import JobState

OPEN = (InferenceRequest.Status.PENDING, InferenceRequest.Status.RUNNING)
#: A request no worker took within this long is sent to one again by the sweep.
REDISPATCH_SECONDS = 30.0


def inference_refusal(job: Job) -> str | None:
    """Why ``job``'s final model cannot predict through the split for one hospital, in
    words; ``None`` when it can."""
    mode = job.training_config().split_mode
    if mode.feature_sets:
        return (
            f"a {mode.name} job cannot predict for one hospital: its parties hold "
            "different features of the same patients, so a prediction needs every party's "
            "features of the same record: its label party asks for predictions on record "
            "identifiers (predict --job N --ids FILE), a request every party's agent answers"
        )
    return None


def serving_batch(job: Job) -> int:
    """The most images one of ``job``'s inference frames may carry: the deployment's
    ``INFERENCE_BATCH_SIZE``, and never more than the job's own batch, which the relay's
    bounds of the job (its largest frame, what its hospitals may store) are sized by."""
    return min(settings.MEDSPLIT["INFERENCE_BATCH_SIZE"], job.training_config().batch_size)


def inference_request(*, actor: Actor, job_id: int, samples: int) -> InferenceRequest:
    """Accept the calling agent's request for predictions on ``samples`` images of its
    own in job ``job_id`` (see the module docstring); dispatched once it commits.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such job with this agent's hospital among its participants.
        Conflict: the job has not completed, its mode cannot predict for one hospital,
            or a request of this hospital for it is still open.
        InvalidInput: ``samples`` is below 1 or above the deployment's bound.
    """
    require_agent(actor, "ask for predictions")
    options = settings.MEDSPLIT
    most = options["INFERENCE_MAX_SAMPLES"]
    if not 1 <= samples <= most:
        raise InvalidInput(f"a request holds 1 to {most} images, not {samples}")
    with transaction.atomic():
        participant = (
            JobParticipant.objects.select_related("job")
            .select_for_update()
            .filter(job_id=job_id, hospital=actor.hospital)
            .first()
        )
        if participant is None:
            raise NotFound(f"no job {job_id} that your hospital took part in")
        job = participant.job
        if job.state != JobState.COMPLETED:
            raise Conflict(
                f"job {job.pk} is {job.state}: only a completed job has a final model to "
                "predict with"
            )
        refusal = inference_refusal(job)
        if refusal is not None:
            raise Conflict(refusal)
        open_one = InferenceRequest.objects.filter(
            job=job, hospital=actor.hospital, status__in=OPEN
        ).first()
        if open_one is not None:
            raise Conflict(
                f"your inference request {open_one.pk} of job {job.pk} is still "
                f"{open_one.status}; ask again once it has ended"
            )
        request = InferenceRequest.objects.create(
            job=job,
            hospital=actor.hospital,
            position=participant.position,
            samples=samples,
            serving_batch=serving_batch(job),
            created_at=timezone.now(),
        )
        audit_record(
            actor=actor,
            action="inference.requested",
            target=f"job:{job.pk}",
            job_id=job.pk,
            details={
                "request": request.pk,
                "samples": samples,
                "serving_batch": request.serving_batch,
            },
        )
        inference_requested_on_commit(request.pk)
    return request


def inference_claim(*, request_id: int, runner: str) -> InferenceRequest | None:
    """Take pending request ``request_id`` for ``runner``; ``None`` if someone has."""
    with transaction.atomic():
        taken = InferenceRequest.objects.filter(
            pk=request_id, status=InferenceRequest.Status.PENDING
        ).update(status=InferenceRequest.Status.RUNNING, runner=runner)
        if not taken:
            return None
        return InferenceRequest.objects.select_related("job", "hospital").get(pk=request_id)


def inference_finish(
    *,
    request: InferenceRequest,
    batches: int,
    bytes_up: int,
    bytes_down: int,
    reason: str = "",
) -> InferenceRequest:
    """Record how ``request`` ended: served (no ``reason``) or failed (``reason``: the
    check or the silence that ended it); audited as counts and sizes."""
    failed = bool(reason)
    with transaction.atomic():
        request.status = (
            InferenceRequest.Status.FAILED if failed else InferenceRequest.Status.COMPLETED
        )
        request.batches_served = batches
        request.bytes_up, request.bytes_down = bytes_up, bytes_down
        request.failure_reason = reason[:2000]
        request.finished_at = timezone.now()
        request.save(
            update_fields=[
                "status",
                "batches_served",
                "bytes_up",
                "bytes_down",
                "failure_reason",
                "finished_at",
            ]
        )
        details: dict[str, object] = {
            "request": request.pk,
            "samples": request.samples,
            "batches": batches,
            "bytes_up": bytes_up,
            "bytes_down": bytes_down,
        }
        if failed:
            details["reason"] = request.failure_reason
        audit_record(
            actor=Actor.system(),
            action="inference.failed" if failed else "inference.served",
            target=f"job:{request.job_id}",
            hospital=request.hospital.slug,
            job_id=request.job_id,
            details=details,
        )
    return request


def inference_dispatched(*, request_id: int) -> None:
    """A worker task was sent for the request (the sweep waits before sending another)."""
    InferenceRequest.objects.filter(pk=request_id).update(dispatched_at=timezone.now())


def inferences_to_run(*, now: datetime | None = None) -> list[int]:
    """Pending requests not sent to a worker within :data:`REDISPATCH_SECONDS`."""
    since = (now or timezone.now()) - timedelta(seconds=REDISPATCH_SECONDS)
    return list(
        InferenceRequest.objects.filter(status=InferenceRequest.Status.PENDING)
        .filter(Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=since))
        .values_list("pk", flat=True)
    )
