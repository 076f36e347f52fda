"""The states of a model export and the only ways it moves between them."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from exports.models import SERVER_PART, ExportConsent, ExportPart, ExportState, ModelExport
from hospitals.models import Hospital
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from medsplit.errors import SealError
from medsplit.protocol.keys import SignedRecipientKey, identity_public_from_b64
from training.dispatch import get_dispatcher
from training.models import Job
from training.states import JobState

logger = logging.getLogger(__name__)

#: The largest sealed part the coordinator keeps (the relay's ciphertext, not a weight).
MAX_PART_BYTES = 512 * 1024 * 1024


def export_key_name(export_id: int) -> str:
    """What an export key is signed for: ``export-N``, never a job's name, so a per-job
    key can never pass for an export key nor the other way round."""
    return f"export-{export_id}"


def _participants(job: Job) -> set[int]:
    return set(job.participants.values_list("hospital_id", flat=True))


def _agent_hospital(actor: Actor) -> Hospital:
    if actor.kind != ActorKind.HOSPITAL or actor.hospital is None:
        raise PermissionDenied("only a hospital's agent answers an export request")
    return actor.hospital


def export_create(*, actor: Actor, job_id: int, recipient_slug: str) -> ModelExport:
    """A consortium admin asks to hand job ``job_id``'s model to one of its hospitals."""
    if actor.kind != ActorKind.PERSON or actor.role != Role.CONSORTIUM_ADMIN:
        raise PermissionDenied("only a consortium admin may request a model export")
    with transaction.atomic():
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.state != JobState.COMPLETED:
            raise Conflict(f"job {job_id} is {job.state}; only a completed job's model is exported")
        recipient = Hospital.objects.filter(slug=recipient_slug).first()
        if recipient is None or recipient.pk not in _participants(job):
            raise Conflict(f"hospital {recipient_slug!r} did not take part in job {job_id}")
        export = ModelExport.objects.create(job=job, recipient=recipient)
        audit_record(
            actor=actor,
            action="export.requested",
            target=f"export:{export.pk}",
            hospital=recipient.slug,
            job_id=job.pk,
        )
    return export


def _locked(export_id: int) -> ModelExport:
    export = ModelExport.objects.select_for_update().filter(pk=export_id).first()
    if export is None:
        raise NotFound(f"export {export_id} does not exist")
    return export


@contextmanager
def _agent_locked(
    actor: Actor, export_id: int, *, recipient_does: str = ""
) -> Iterator[tuple[Hospital, ModelExport]]:
    """The calling agent's hospital and the export, locked for one transaction.

    The hospital must have taken part in the export's job; with ``recipient_does`` (what
    only the recipient may do, for the refusal), it must be the export's recipient.
    """
    hospital = _agent_hospital(actor)
    with transaction.atomic():
        export = _locked(export_id)
        if recipient_does and export.recipient_id != hospital.pk:
            raise PermissionDenied(f"only export {export.pk}'s receiving hospital {recipient_does}")
        if hospital.pk not in _participants(export.job):
            raise PermissionDenied(
                f"hospital {hospital.slug!r} did not take part in job {export.job_id}"
            )
        yield hospital, export


def _check_answerable(export: ModelExport, hospital: Hospital) -> None:
    if export.state == ExportState.REFUSED:
        raise Conflict(f"export {export.pk} was already refused by {export.refused_by.slug!r}")
    if export.consents.filter(hospital=hospital).exists():
        raise Conflict(f"hospital {hospital.slug!r} already approved export {export.pk}")


def export_approve(*, actor: Actor, export_id: int) -> ModelExport:
    """A participating hospital's agent approves; the last approval approves the export."""
    with _agent_locked(actor, export_id) as (hospital, export):
        _check_answerable(export, hospital)
        if hospital.pk == export.recipient_id and not export.recipient_key:
            raise Conflict(
                f"export {export.pk}: the receiving hospital publishes its export key "
                f"(POST /api/agent/exports/{export.pk}/key/) before it approves"
            )
        ExportConsent.objects.create(export=export, hospital=hospital)
        if set(export.consents.values_list("hospital_id", flat=True)) == _participants(export.job):
            export.state = ExportState.APPROVED
            export.save(update_fields=["state"])
            transaction.on_commit(lambda: _notify_approved(export.pk))
        audit_record(
            actor=actor,
            action="export.approved",
            target=f"export:{export.pk}",
            hospital=hospital.slug,
            job_id=export.job_id,
            details={"state": export.state},
        )
    return export


def export_refuse(*, actor: Actor, export_id: int, reason: str) -> ModelExport:
    """A participating hospital's agent refuses: the export stops for good."""
    with _agent_locked(actor, export_id) as (hospital, export):
        _check_answerable(export, hospital)
        if export.state == ExportState.APPROVED:
            raise Conflict(f"export {export.pk} is already approved by every hospital")
        export.state = ExportState.REFUSED
        export.refused_by = hospital
        export.refusal_reason = reason
        export.save(update_fields=["state", "refused_by", "refusal_reason"])
        audit_record(
            actor=actor,
            action="export.refused",
            target=f"export:{export.pk}",
            hospital=hospital.slug,
            job_id=export.job_id,
            details={"reason_chars": len(reason)},
        )
    return export


def _notify_approved(export_id: int) -> None:
    """Have a worker seal the server segment now; the sweep does it otherwise."""
    try:
        send = getattr(get_dispatcher(), "export_approved", None)
        if send is not None:
            send(export_id)
    except Exception:  # the sweep will find the export; an approval must not fail here
        logger.exception("could not notify the workers about export %s", export_id)


def export_key_publish(*, actor: Actor, export_id: int, key: str, signature: str) -> ModelExport:
    """The receiving hospital's agent publishes a fresh export key, signed by its identity.

    The signature is checked against the identity key the coordinator registered for the
    hospital (so only the recipient's agent can publish it); the key is fixed once the
    export is approved (the senders seal to it).
    """
    with _agent_locked(actor, export_id, recipient_does="publishes its key") as (
        hospital,
        export,
    ):
        if export.state != ExportState.PENDING:
            raise Conflict(f"export {export.pk} is {export.state}: its key can no longer change")
        if not hospital.identity_key:
            raise Conflict("this hospital has no identity key yet: the agent moves to one first")
        try:
            signed = SignedRecipientKey.from_json(
                job=export_key_name(export.pk),
                hospital=hospital.slug,
                data={"key": key, "signature": signature},
            )
            signed.verify(identity_public_from_b64(hospital.identity_key))
        except (SealError, TypeError) as e:
            raise InvalidInput("the export key is not valid", details={"key": [str(e)]}) from None
        export.recipient_key = signed.key.b64()
        export.recipient_key_signature = signature
        export.recipient_key_sha256 = signed.key.sha256()
        export.save(
            update_fields=["recipient_key", "recipient_key_signature", "recipient_key_sha256"]
        )
        audit_record(
            actor=actor,
            action="export.key_published",
            target=f"export:{export.pk}",
            hospital=hospital.slug,
            job_id=export.job_id,
            details={"sha256": export.recipient_key_sha256},
        )
    return export


def expected_parts(export: ModelExport) -> list[str]:
    """The parts an approved export waits for: every other participant's, the server's."""
    slugs = export.job.participants.exclude(hospital_id=export.recipient_id).values_list(
        "hospital__slug", flat=True
    )
    return [*sorted(slugs), SERVER_PART]


def export_view(*, actor: Actor, export_id: int) -> ModelExport:
    """An export as a participant's agent sees it (its key, the parts sealed so far)."""
    hospital = _agent_hospital(actor)
    export = (
        ModelExport.objects.select_related("job", "recipient", "refused_by")
        .filter(pk=export_id)
        .first()
    )
    if export is None or hospital.pk not in _participants(export.job):
        raise NotFound(f"no export {export_id} of a job of yours")
    return export


def _store_part(
    export: ModelExport, *, name: str, sender: Hospital | None, blob: bytes, actor: Actor
) -> ExportPart:
    if not blob:
        raise InvalidInput("a sealed part has bytes")
    if len(blob) > MAX_PART_BYTES:
        raise InvalidInput(f"a sealed part has at most {MAX_PART_BYTES} bytes, not {len(blob)}")
    if export.parts.filter(name=name).exists():
        raise Conflict(f"export {export.pk}: part {name!r} was already sealed; it is sent once")
    digest = hashlib.sha256(blob).hexdigest()
    part = ExportPart.objects.create(
        export=export,
        name=name,
        sender=sender,
        ciphertext=blob,
        size_bytes=len(blob),
        sha256=digest,
    )
    audit_record(
        actor=actor,
        action="export.part_sealed",
        target=f"export:{export.pk}",
        hospital=sender.slug if sender else "",
        job_id=export.job_id,
        details={"part": name, "size_bytes": len(blob), "sha256": digest},
    )
    return part


def export_part_upload(*, actor: Actor, export_id: int, blob: bytes) -> ExportPart:
    """A participating hospital's agent leaves its segments, sealed to the export key."""
    with _agent_locked(actor, export_id) as (hospital, export):
        if export.state != ExportState.APPROVED:
            raise Conflict(
                f"export {export.pk} is {export.state}: segments are sealed only once every "
                "participating hospital approved it"
            )
        if hospital.pk == export.recipient_id:
            raise Conflict(f"export {export.pk}: the receiving hospital keeps its own segments")
        return _store_part(export, name=hospital.slug, sender=hospital, blob=blob, actor=actor)


def export_server_part_store(*, export_id: int, blob: bytes) -> ExportPart:
    """The worker leaves the job's server segment, sealed to the export key."""
    with transaction.atomic():
        export = _locked(export_id)
        if export.state != ExportState.APPROVED:
            raise Conflict(f"export {export.pk} is {export.state}: nothing is sealed for it")
        return _store_part(export, name=SERVER_PART, sender=None, blob=blob, actor=Actor.system())


def exports_to_seal() -> list[int]:
    """Approved exports whose server segment is not sealed yet (the sweep's safety net)."""
    return list(
        ModelExport.objects.filter(state=ExportState.APPROVED)
        .exclude(parts__name=SERVER_PART)
        .values_list("pk", flat=True)
    )


def export_part_download(*, actor: Actor, export_id: int, name: str) -> ExportPart:
    """One sealed part, for the receiving hospital's agent only."""
    hospital = _agent_hospital(actor)
    export = ModelExport.objects.filter(pk=export_id).first()
    if export is None or export.recipient_id != hospital.pk:
        raise PermissionDenied(f"only export {export_id}'s receiving hospital fetches its parts")
    part = export.parts.filter(name=name).first()
    if part is None:
        raise NotFound(f"export {export_id} has no sealed part {name!r} yet")
    return part


def export_fetched(*, actor: Actor, export_id: int, parts: int, size_bytes: int) -> ModelExport:
    """The receiving agent assembled and checked the model: the export's last step."""
    with _agent_locked(actor, export_id, recipient_does="fetches it") as (hospital, export):
        if export.state != ExportState.APPROVED:
            raise Conflict(f"export {export.pk} is {export.state}: nothing can be fetched")
        export.fetched_at = timezone.now()
        export.save(update_fields=["fetched_at"])
        audit_record(
            actor=actor,
            action="export.fetched",
            target=f"export:{export.pk}",
            hospital=hospital.slug,
            job_id=export.job_id,
            details={"parts": parts, "size_bytes": size_bytes},
        )
    return export
