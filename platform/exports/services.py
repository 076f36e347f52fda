"""The states of a model export and the only ways it moves between them."""

from __future__ import annotations

from django.db import transaction

from audit.services import audit_record
from exports.models import ExportConsent, ExportState, ModelExport
from hospitals.models import Hospital
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import Conflict, NotFound, PermissionDenied
from training.models import Job
from training.states import JobState


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


def _check_answerable(export: ModelExport, hospital: Hospital) -> None:
    if hospital.pk not in _participants(export.job):
        raise PermissionDenied(
            f"hospital {hospital.slug!r} did not take part in job {export.job_id}"
        )
    if export.state == ExportState.REFUSED:
        raise Conflict(f"export {export.pk} was already refused by {export.refused_by.slug!r}")
    if export.consents.filter(hospital=hospital).exists():
        raise Conflict(f"hospital {hospital.slug!r} already approved export {export.pk}")


def export_approve(*, actor: Actor, export_id: int) -> ModelExport:
    """A participating hospital's agent approves; the last approval approves the export."""
    hospital = _agent_hospital(actor)
    with transaction.atomic():
        export = _locked(export_id)
        _check_answerable(export, hospital)
        ExportConsent.objects.create(export=export, hospital=hospital)
        if set(export.consents.values_list("hospital_id", flat=True)) == _participants(export.job):
            export.state = ExportState.APPROVED
            export.save(update_fields=["state"])
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
    hospital = _agent_hospital(actor)
    with transaction.atomic():
        export = _locked(export_id)
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
