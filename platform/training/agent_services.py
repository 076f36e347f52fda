"""What a hospital's agent reports about its own jobs and turns: its per-job recipient key,
the hand-offs it sealed, a failed precondition (its data cannot be used) that ends its
turn before training, and its training loss where the loss is computed at the hospital.

Each checks that the turn is the calling agent's own, then calls
:mod:`training.services`; the agent's report is audited under the agent's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from hospitals.hijack import is_hijack_report, record_hijack_report
from hospitals.models import Hospital
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import require_agent
from medsplit.errors import SealError
from medsplit.modes import Side, require_mode
from medsplit.protocol.keys import SignedRecipientKey, identity_public_from_b64
from training.dispatch import job_changed_on_commit
from training.models import HandOff, Job, JobParticipant, Turn
from training.services import (
    EXTRA_MODES_SETTING,
    SealedFor,
    handoffs_record,
    turn_fail,
    turn_record_hospital_loss,
)
from training.states import TERMINAL

_MAX_REASON = 2000


def _own_turn(actor: Actor, job_id: int, turn_id: int) -> Turn:
    turn = Turn.objects.select_related("hospital").filter(pk=turn_id, job_id=job_id).first()
    if turn is None or turn.hospital_id != actor.hospital.pk:
        raise NotFound(f"no turn {turn_id} of yours in job {job_id}")
    return turn


def _attempt_that_completed(turn: Turn) -> Turn:
    """The attempt of ``turn``'s place (round and position) that completed, else ``turn``.

    A turn's server side may fail and be tried again (a new attempt, a new id) while the
    hospital's run goes on, since both sides meet on the place: the hospital names the
    attempt it was assigned, and its hand-off belongs to the one that completed. (The
    agent used to ask for its assignment again first, on the next hospital's path.)
    """
    completed = (
        Turn.objects.select_related("hospital")
        .filter(
            job_id=turn.job_id,
            round_id=turn.round_id,
            position=turn.position,
            hospital_id=turn.hospital_id,
            status=Turn.Status.COMPLETED,
        )
        .order_by("-attempt")
        .first()
    )
    return completed or turn


def agent_recipient_key_publish(
    *, actor: Actor, job_id: int, key: str, signature: str
) -> JobParticipant:
    """The calling agent publishes its hospital's per-job recipient key for ``job_id``,
    signed with its identity key. The coordinator checks the signature against the
    identity key it pinned for the hospital (so a hospital can only publish keys it holds
    the identity for), keeps the key with the generation that signed it, and audits it.
    Publishing the key already held changes nothing; another key replaces it (an agent
    that lost its work directory and re-enrolled).

    Raises:
        PermissionDenied: not an agent.
        NotFound: the agent's hospital does not take part in the job.
        Conflict: the job has ended, or the hospital has no identity key yet.
        InvalidInput: the key or signature is malformed, or does not verify.
    """
    require_agent(actor, "publish a recipient key")
    with transaction.atomic():
        hospital = Hospital.objects.select_for_update().get(pk=actor.hospital.pk)
        participant = (
            JobParticipant.objects.select_for_update()
            .select_related("job")
            .filter(job_id=job_id, hospital=hospital)
            .first()
        )
        if participant is None:
            raise NotFound(f"no job {job_id} of yours")
        job: Job = participant.job
        if job.state in TERMINAL:
            raise Conflict(
                f"job {job_id} is {job.state}: it needs no recipient key any more",
                details={"state": job.state},
            )
        if not hospital.identity_key:
            raise Conflict(
                "this hospital has no identity key yet: the agent moves to one first "
                "(POST /api/agent/identity/)"
            )
        try:
            signed = SignedRecipientKey.from_json(
                job=f"job-{job_id}",
                hospital=hospital.slug,
                data={"key": key, "signature": signature},
            )
            signed.verify(identity_public_from_b64(hospital.identity_key))
        except (SealError, TypeError) as e:
            raise InvalidInput(
                "the recipient key is not valid", details={"key": [str(e)]}
            ) from None
        digest = signed.key.sha256()
        if (
            participant.recipient_key_sha256 == digest
            and participant.recipient_key_generation == hospital.identity_generation
        ):
            return participant
        replaced = participant.recipient_key_sha256 or None
        participant.recipient_key = signed.key.b64()
        participant.recipient_key_signature = signature
        participant.recipient_key_sha256 = digest
        participant.recipient_key_generation = hospital.identity_generation
        participant.recipient_key_published_at = timezone.now()
        participant.save(
            update_fields=[
                "recipient_key",
                "recipient_key_signature",
                "recipient_key_sha256",
                "recipient_key_generation",
                "recipient_key_published_at",
            ]
        )
        audit_record(
            actor=actor,
            action="recipient_key.published",
            target=f"job:{job_id}",
            hospital=hospital.slug,
            job_id=job_id,
            details={
                "sha256": digest,
                "replaced_sha256": replaced,
                "identity_generation": hospital.identity_generation,
            },
        )
    return participant


def agent_handoff_record(
    *,
    actor: Actor,
    job_id: int,
    turn_id: int,
    recipient: str,
    ciphertext_sha256: str,
    size_bytes: int,
) -> HandOff:
    """Record that the calling agent sealed its weights after ``turn_id`` for ``recipient``
    (:func:`agent_handoffs_record` with one blob).

    Raises:
        PermissionDenied: not an agent.
        NotFound: the turn is not this agent's.
        InvalidInput: unknown recipient, bad hash or size (see ``handoffs_record``).
        Conflict: the turn is not running or completed, or another blob was recorded.
    """
    sealed = {"recipient": recipient, "ciphertext_sha256": ciphertext_sha256}
    return agent_handoffs_record(
        actor=actor, job_id=job_id, turn_id=turn_id, sealed=[{**sealed, "size_bytes": size_bytes}]
    )[0]


def agent_handoffs_record(
    *, actor: Actor, job_id: int, turn_id: int, sealed: Sequence[Mapping[str, Any]]
) -> list[HandOff]:
    """Record that the calling agent sealed its weights after ``turn_id`` (the attempt of
    its place that completed, when it was tried again) for each recipient of ``sealed``
    (``recipient``, ``ciphertext_sha256``, ``size_bytes``), all or none
    (``handoffs_record``).

    Raises:
        PermissionDenied: not an agent.
        NotFound: the turn is not this agent's.
        InvalidInput: an unknown recipient, bad hash or size (see ``handoffs_record``).
        Conflict: the turn is not running or completed, or another blob was recorded.
    """
    require_agent(actor, "record a hand-off")
    turn = _attempt_that_completed(_own_turn(actor, job_id, turn_id))
    slugs = [entry["recipient"] for entry in sealed]
    hospitals = {h.slug: h for h in Hospital.objects.filter(slug__in=slugs)}
    unknown = [slug for slug in slugs if slug not in hospitals]
    if unknown:
        raise InvalidInput(
            "the hand-off record is not valid",
            details={"recipient": [f"no hospital {slug!r}" for slug in unknown]},
        )
    return handoffs_record(
        turn=turn,
        sender=actor.hospital,
        sealed=[
            SealedFor(
                hospitals[entry["recipient"]], entry["ciphertext_sha256"], entry["size_bytes"]
            )
            for entry in sealed
        ],
    )


def agent_problem_report(*, actor: Actor, job_id: int, turn_id: int, reason: str) -> Turn:
    """The agent cannot take its running turn (bad data, a model that does not fit): the
    turn fails with the agent's reason and the job's policy applies.

    The reason is the agent's own words: it names files, never pixel data.

    Raises:
        PermissionDenied: not an agent.
        NotFound: the turn is not this agent's.
        InvalidInput: an empty reason.
        Conflict: the turn is not running.
    """
    require_agent(actor, "report a problem")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("say what the problem is", details={"reason": ["must not be empty"]})
    turn = _own_turn(actor, job_id, turn_id)
    reason = reason.strip()[:_MAX_REASON]
    with transaction.atomic():
        if turn.status != Turn.Status.RUNNING:
            raise Conflict(
                f"turn {turn.pk} is {turn.status}; only a running turn can be given up",
                details={"status": turn.status},
            )
        failed = turn_fail(
            turn=turn, reason=f"{actor.hospital.slug} reported a failed precondition: {reason}"
        )
        audit_record(
            actor=actor,
            action="turn.problem_reported",
            target=f"turn:{turn.pk}",
            hospital=actor.hospital.slug,
            job_id=job_id,
            details={"reason": reason},
        )
        if is_hijack_report(reason):
            record_hijack_report(actor=actor, job_id=job_id, turn_id=turn.pk, reason=reason)
        job_changed_on_commit(job_id)
    return failed


def agent_loss_report(*, actor: Actor, job_id: int, turn_id: int, step: int, loss: float) -> Turn:
    """The calling agent's training loss at ``step`` of its running turn, in a mode whose
    loss is computed at the hospital (U-shaped): the dashboard's loss then has a source.

    One number the hospital chose to send (its agent's ``report_loss``); not audited, as
    the worker's own progress reports are not (one a second would bury the log). If the
    server side of the turn was tried again meanwhile, the running attempt of the same
    place takes it.

    Raises:
        PermissionDenied: not an agent.
        NotFound: the turn is not this agent's.
        InvalidInput: the step is beyond the turn's limit.
        Conflict: the job's server computes the loss itself, or the turn is not running.
    """
    require_agent(actor, "report a training loss")
    turn = _own_turn(actor, job_id, turn_id)
    job = turn.job
    if require_mode(job.mode, setting=EXTRA_MODES_SETTING).labels != Side.HOSPITAL:
        raise Conflict(
            f"job {job_id} is in mode {job.mode!r}: its server computes the loss, so a "
            "hospital's is not taken",
            details={"mode": job.mode},
        )
    cap = job.job_description().max_steps_per_turn
    if cap is not None and step > cap:
        raise InvalidInput(
            "the step is beyond the turn's limit",
            details={"step": [f"at most {cap} steps per turn in this job"]},
        )
    if turn.status != Turn.Status.RUNNING:
        running = Turn.objects.filter(
            round_id=turn.round_id, position=turn.position, status=Turn.Status.RUNNING
        ).first()
        turn = running or turn
    return turn_record_hospital_loss(turn=turn, step=step, loss=loss)
