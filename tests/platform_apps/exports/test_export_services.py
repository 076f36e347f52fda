"""The export-by-consent state machine: who may move it, and the refusals it names."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from exports import services
from exports.models import ExportState
from kernel.errors import Conflict, NotFound, PermissionDenied
from medsplit.protocol.keys import (
    RecipientKey,
    SignedRecipientKey,
    generate_identity_key,
    identity_public_b64,
)
from tests.platform_apps.conftest import agent_actor, make_hospital

pytestmark = pytest.mark.django_db


def _publish_key(export, receiver) -> None:
    """The receiver's agent publishes a fresh export key signed by its identity."""
    identity = generate_identity_key()
    receiver.identity_key = identity_public_b64(identity)
    receiver.save(update_fields=["identity_key"])
    signed = SignedRecipientKey.sign(
        job=services.export_key_name(export.pk),
        hospital=receiver.slug,
        key=RecipientKey.generate().public(),
        identity=identity,
    ).to_json()
    services.export_key_publish(actor=agent_actor(receiver), export_id=export.pk, **signed)


@pytest.fixture
def job(make_job):
    return make_job("completed")


def test_every_approval_approves_the_export_and_each_step_is_audited(
    job, three_hospitals, admin_actor
) -> None:
    export = services.export_create(
        actor=admin_actor, job_id=job.pk, recipient_slug=three_hospitals[0].slug
    )
    _publish_key(export, three_hospitals[0])
    for hospital in three_hospitals:
        assert export.state == ExportState.PENDING
        export = services.export_approve(actor=agent_actor(hospital), export_id=export.pk)
    assert export.state == ExportState.APPROVED
    actions = list(AuditEvent.objects.filter(job_id=job.pk).values_list("action", flat=True))
    assert actions.count("export.approved") == 3 and "export.requested" in actions


def test_one_refusal_stops_the_export_naming_who_and_why(job, three_hospitals, admin_actor):
    export = services.export_create(
        actor=admin_actor, job_id=job.pk, recipient_slug=three_hospitals[1].slug
    )
    services.export_approve(actor=agent_actor(three_hospitals[0]), export_id=export.pk)
    export = services.export_refuse(
        actor=agent_actor(three_hospitals[2]), export_id=export.pk, reason="ethics board"
    )
    assert (export.state, export.refused_by, export.refusal_reason) == (
        ExportState.REFUSED,
        three_hospitals[2],
        "ethics board",
    )
    with pytest.raises(Conflict, match="already refused by 'northside'"):
        services.export_approve(actor=agent_actor(three_hospitals[1]), export_id=export.pk)


def test_out_of_order_requests_are_refused_naming_what_was_wrong(
    job, make_job, three_hospitals, admin_actor, hospital_admin_actor
) -> None:
    slug = three_hospitals[0].slug
    with pytest.raises(PermissionDenied, match="consortium admin"):
        services.export_create(actor=hospital_admin_actor, job_id=job.pk, recipient_slug=slug)
    with pytest.raises(Conflict, match="is draft; only a completed"):
        services.export_create(actor=admin_actor, job_id=make_job().pk, recipient_slug=slug)
    outsider = make_hospital("outsider")
    with pytest.raises(Conflict, match="'outsider' did not take part"):
        services.export_create(actor=admin_actor, job_id=job.pk, recipient_slug="outsider")
    export = services.export_create(
        actor=admin_actor, job_id=job.pk, recipient_slug=three_hospitals[1].slug
    )
    with pytest.raises(PermissionDenied, match="'outsider' did not take part"):
        services.export_approve(actor=agent_actor(outsider), export_id=export.pk)
    services.export_approve(actor=agent_actor(three_hospitals[0]), export_id=export.pk)
    with pytest.raises(Conflict, match="already approved export"):
        services.export_approve(actor=agent_actor(three_hospitals[0]), export_id=export.pk)
    with pytest.raises(NotFound, match="export 999999 does not exist"):
        services.export_approve(actor=agent_actor(three_hospitals[0]), export_id=999999)


def test_an_approved_export_relays_its_sealed_parts_and_audits_each_step(
    job, three_hospitals, admin_actor
) -> None:
    receiver, *senders = three_hospitals
    export = services.export_create(actor=admin_actor, job_id=job.pk, recipient_slug=receiver.slug)
    _publish_key(export, receiver)
    for hospital in three_hospitals:
        services.export_approve(actor=agent_actor(hospital), export_id=export.pk)
    assert services.exports_to_seal() == [export.pk]
    assert services.expected_parts(export) == [*sorted(h.slug for h in senders), "server"]
    services.export_part_upload(actor=agent_actor(senders[0]), export_id=export.pk, blob=b"x" * 7)
    services.export_server_part_store(export_id=export.pk, blob=b"y" * 3)
    assert services.exports_to_seal() == []
    part = services.export_part_download(
        actor=agent_actor(receiver), export_id=export.pk, name=senders[0].slug
    )
    assert bytes(part.ciphertext) == b"x" * 7
    services.export_fetched(
        actor=agent_actor(receiver), export_id=export.pk, parts=2, size_bytes=10
    )
    actions = list(
        AuditEvent.objects.filter(target=f"export:{export.pk}").values_list("action", flat=True)
    )
    assert actions == [
        "export.requested",
        "export.key_published",
        *["export.approved"] * 3,
        "export.part_sealed",
        "export.part_sealed",
        "export.fetched",
    ]
    with pytest.raises(PermissionDenied, match="receiving hospital"):
        services.export_fetched(
            actor=agent_actor(senders[1]), export_id=export.pk, parts=0, size_bytes=0
        )
