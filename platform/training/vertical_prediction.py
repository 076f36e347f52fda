"""A vertical job's prediction, asked for by its label party's agent: writes.

``medsplit-agent predict --job N --ids FILE`` at the label party (the first participant
in the job's order: what is predicted is its label) asks for predictions on ``records``
of the records it named (``POST /api/agent/assignments/{job}/vertical-predictions/``).
The coordinator refuses at once, naming the party, when the caller is not the label
party, the job has not completed or is not vertical, or any participant's agent is
offline (no heartbeat within ``HOSPITAL_OFFLINE_AFTER_SECONDS``, as "online" means
everywhere). Otherwise it starts a joint pass as an evaluation starts one
(:class:`~training.models.Evaluation` with the ``prediction`` purpose, one part per
party): every party's agent picks its part up from its assignment, the parties align
their records by PSI, one worker serves every party's batches
(``workers/evaluation_runner.py``, ``medsplit.turns.vertical_eval`` with
``predict=True``) and the logits reach the label party alone. A party that does not
answer within the silence timeout ends it, named. The audit log records counts and
sizes, never an identifier or a value.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from audit.services import audit_record
from hospitals.selectors import hospital_is_online
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent
from training.dispatch import job_changed_on_commit
from training.evaluation import complete_joint, joint_evaluation
from training.models import Evaluation, HospitalEvaluation, Job, JobParticipant
from training.states import JobState

__all__ = ["prediction_finish", "vertical_prediction_request"]


def vertical_prediction_request(*, actor: Actor, job_id: int, records: int) -> HospitalEvaluation:
    """Accept the label party's request for predictions on ``records`` of its records
    (see the module docstring); its own part of the pass is returned, dispatched once
    the transaction commits.

    Raises:
        PermissionDenied: not an agent.
        NotFound: no such job with this agent's hospital among its participants.
        Conflict: the job has not completed or is not vertical, the caller is not the
            label party, a participant's agent is offline, or an evaluation or
            prediction of the job is still running.
        InvalidInput: ``records`` below 1 or above ``INFERENCE_MAX_SAMPLES``.
    """
    require_agent(actor, "ask for predictions")
    most = settings.MEDSPLIT["INFERENCE_MAX_SAMPLES"]
    if not 1 <= records <= most:
        raise InvalidInput(f"a request names 1 to {most} records, not {records}")
    with transaction.atomic():
        mine = JobParticipant.objects.filter(job_id=job_id, hospital=actor.hospital).first()
        if mine is None:
            raise NotFound(f"no job {job_id} that your hospital took part in")
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.COMPLETED:
            raise Conflict(
                f"job {job.pk} is {job.state}: only a completed job has a final model to "
                "predict with"
            )
        if not joint_evaluation(job):
            raise Conflict(
                f"job {job.pk} is not vertical: ask with image paths (predict --job N PATH…)"
            )
        participants = list(job.participants.select_related("hospital").order_by("position"))
        label = participants[0].hospital.slug
        if label != actor.hospital.slug:
            raise Conflict(
                f"only job {job.pk}'s label party, {label}, can ask for its predictions: "
                "what is predicted is its label"
            )
        now = timezone.now()
        offline = [
            p.hospital.slug
            for p in participants
            if not hospital_is_online(hospital=p.hospital, now=now)
        ]
        if offline:
            raise Conflict(
                f"a vertical prediction needs every party's agent online; {', '.join(offline)} "
                f"sent no heartbeat within {settings.MEDSPLIT['HOSPITAL_OFFLINE_AFTER_SECONDS']} s"
            )
        running = job.evaluations.filter(status=Evaluation.Status.RUNNING).first()
        if running is not None:
            raise Conflict(
                f"{running.purpose} {running.attempt} of job {job.pk} is still running; ask "
                "again once it has ended"
            )
        last = job.evaluations.aggregate(last=Max("attempt"))["last"] or 0
        prediction = Evaluation.objects.create(
            job=job,
            attempt=last + 1,
            purpose=Evaluation.Purpose.PREDICTION,
            created_at=now,
        )
        # Every part's bound is the requested count: the intersection is no larger.
        parts = [
            HospitalEvaluation.objects.create(
                evaluation=prediction,
                job=job,
                hospital=p.hospital,
                position=p.position,
                status=HospitalEvaluation.Status.RUNNING,
                test_samples=records,
                started_at=now,
            )
            for p in participants
        ]
        audit_record(
            actor=actor,
            action="prediction.requested",
            target=f"job:{job.pk}",
            job_id=job.pk,
            details={"attempt": prediction.attempt, "records": records},
        )
        job_changed_on_commit(job.pk)
    return parts[0]


def prediction_finish(
    *,
    parts: list[HospitalEvaluation],
    records: int,
    bytes_up: dict[int, int],
    bytes_down: dict[int, int],
) -> None:
    """Every party's part of a served prediction completed over ``records`` aligned
    records (no more than were asked for); audited with the sizes only.

    Raises:
        InvalidInput: more records than the label party asked for.
        Conflict: a part ended meanwhile.
    """
    asked = min(p.test_samples for p in parts)
    if not 1 <= records <= asked:
        raise InvalidInput(f"{records} aligned records; the label party asked for {asked}")
    complete_joint(
        parts=parts,
        figures={},
        records=records,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        action="prediction.hospital_completed",
    )
