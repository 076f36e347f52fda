"""Hospital services called directly, as the admin, commands and tasks would."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from hospitals import services
from hospitals.errors import EnrolmentCodeUsed, RelayProvisioningFailed
from hospitals.models import AgentToken, EnrolmentCode, Hospital
from hospitals.relay_acl import relay_username
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from tests.platform_apps.conftest import agent_actor
from tests.platform_apps.hospitals.helpers import issue_code, new_identity_key, use_provisioner

pytestmark = pytest.mark.django_db

SUMMARY = {"image_shape": [1, 28, 28], "label_counts": {"0": 1}, "split_sizes": {"train": 1}}


def test_register_makes_the_slug_from_the_name(admin_actor) -> None:
    registration = services.hospital_register(actor=admin_actor, name="  Royal Free  ")
    assert registration.hospital.slug == "royal-free"
    assert registration.hospital.name == "Royal Free"
    assert registration.enrolment_code is not None


def test_register_needs_a_usable_slug(admin_actor) -> None:
    with pytest.raises(InvalidInput) as caught:
        services.hospital_register(actor=admin_actor, name="!!!")
    assert "slug" in caught.value.details
    assert not Hospital.objects.exists()


def test_the_system_may_register(db) -> None:
    registration = services.hospital_register(actor=Actor.system(), name="X", approve=False)
    assert registration.hospital.status == "requested"
    assert AuditEvent.objects.get(action="hospital.registered").actor == "system"


def test_hospital_admins_may_not_approve_even_their_own(hospital_admin_actor, hospital_a) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(status="requested")
    hospital_a.refresh_from_db()
    with pytest.raises(PermissionDenied):
        services.hospital_approve(actor=hospital_admin_actor, hospital=hospital_a)


def test_a_hospital_admin_gets_404_for_another_hospital(hospital_admin_actor, hospital_b) -> None:
    with pytest.raises(NotFound):
        services.enrolment_code_issue(actor=hospital_admin_actor, hospital=hospital_b)
    with pytest.raises(NotFound):
        services.hospital_tokens_revoke(actor=hospital_admin_actor, hospital=hospital_b)


def test_a_rejected_hospital_may_be_approved_later(admin_actor, hospital_a) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(status="rejected")
    approval = services.hospital_approve(actor=admin_actor, hospital=hospital_a)
    assert approval.hospital.status == "approved"


def test_revoking_a_requested_hospital_is_a_conflict(admin_actor, hospital_a) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(status="requested")
    with pytest.raises(Conflict):
        services.hospital_tokens_revoke(actor=admin_actor, hospital=hospital_a)


def test_revocation_also_kills_unused_codes(admin_actor, hospital_a) -> None:
    code = issue_code(hospital_a)
    result = services.hospital_tokens_revoke(actor=admin_actor, hospital=hospital_a)
    assert result.codes_revoked == 1
    assert EnrolmentCode.objects.get().revoked_at is not None
    with pytest.raises(Exception) as caught:
        services.agent_enrol(code=code, identity_key=new_identity_key())
    assert caught.value.code == "enrolment_code_revoked"


def test_a_relay_that_refuses_revocation_leaves_the_tokens(admin_actor, hospital_a) -> None:
    """The relay user and the tokens go together, or neither does: the caller retries."""
    services.agent_enrol(code=issue_code(hospital_a), identity_key=new_identity_key())
    with use_provisioner("FailingProvisioner"), pytest.raises(RelayProvisioningFailed):
        services.hospital_tokens_revoke(actor=admin_actor, hospital=hospital_a)
    assert AgentToken.objects.filter(revoked_at__isnull=True).count() == 1
    assert Hospital.objects.get(pk=hospital_a.pk).status == "enrolled"
    assert not AuditEvent.objects.filter(action="token.revoked").exists()


def test_an_enrolment_after_suspension_restores_the_hospital(admin_actor, hospital_a) -> None:
    services.hospital_tokens_revoke(actor=admin_actor, hospital=hospital_a)
    hospital_a.refresh_from_db()
    code = services.enrolment_code_issue(actor=admin_actor, hospital=hospital_a)
    enrolment = services.agent_enrol(code=code.plaintext, identity_key=new_identity_key())
    assert enrolment.hospital.status == "enrolled"
    assert enrolment.relay.username == relay_username("st-marys")


def test_an_enrolment_code_is_single_use(approved_hospital) -> None:
    code = issue_code(approved_hospital)
    services.agent_enrol(code=code, identity_key=new_identity_key())
    with pytest.raises(EnrolmentCodeUsed):
        services.agent_enrol(code=code, identity_key=new_identity_key())
    assert AgentToken.objects.count() == 1


def test_rotation_is_for_the_tokens_own_agent(hospital_a, hospital_b) -> None:
    enrolment = services.agent_enrol(code=issue_code(hospital_a), identity_key=new_identity_key())
    token = AgentToken.objects.get(key_id=enrolment.token.key_id)
    with pytest.raises(NotFound):
        services.agent_token_rotate(actor=agent_actor(hospital_b), token=token)
    assert AgentToken.objects.get(pk=token.pk).revoked_at is None


def test_rotating_a_revoked_token_is_a_conflict(hospital_a) -> None:
    enrolment = services.agent_enrol(code=issue_code(hospital_a), identity_key=new_identity_key())
    token = AgentToken.objects.get(key_id=enrolment.token.key_id)
    services.agent_token_rotate(actor=agent_actor(hospital_a), token=token)
    with pytest.raises(Conflict):
        services.agent_token_rotate(actor=agent_actor(hospital_a), token=token)
    assert AgentToken.objects.filter(revoked_at__isnull=True).count() == 1


def test_heartbeats_are_for_agents(admin_actor, hospital_a) -> None:
    with pytest.raises(PermissionDenied):
        services.agent_heartbeat(
            actor=admin_actor, agent_status="idle", agent_version="1", dataset_summary=SUMMARY
        )


def test_a_heartbeat_with_an_unknown_status_is_refused(hospital_a) -> None:
    with pytest.raises(InvalidInput):
        services.agent_heartbeat(
            actor=agent_actor(hospital_a),
            agent_status="x",
            agent_version="1",
            dataset_summary=SUMMARY,
        )
    assert Hospital.objects.get(pk=hospital_a.pk).last_seen_at is None


# -- identity keys ------------------------------------------------------------------------


def test_enrolment_pins_the_identity_fingerprint_and_a_new_key_is_a_new_generation(
    approved_hospital,
) -> None:
    from hospitals.keys import parse_identity_key

    first = new_identity_key()
    enrolment = services.agent_enrol(code=issue_code(approved_hospital), identity_key=first)
    hospital = enrolment.hospital
    assert hospital.identity_fingerprint == parse_identity_key(first).fingerprint
    assert hospital.identity_generation == 1 and hospital.identity_enrolled_at is not None
    assert not AuditEvent.objects.filter(action="identity.replaced").exists()
    # Re-enrolled with the same key (credentials lost, key kept): the same identity.
    again = services.agent_enrol(code=issue_code(hospital), identity_key=first).hospital
    assert again.identity_generation == 1
    # Re-enrolled with a new key (a reinstalled agent): a new generation, audited.
    second = new_identity_key()
    moved = services.agent_enrol(code=issue_code(hospital), identity_key=second).hospital
    assert moved.identity_generation == 2
    assert moved.identity_fingerprint == parse_identity_key(second).fingerprint
    (event,) = AuditEvent.objects.filter(action="identity.replaced")
    assert event.details["previous_fingerprint"] == parse_identity_key(first).fingerprint
    assert event.details["identity_generation"] == 2
    assert event.details["via"].startswith("enrolment code ")


def test_a_legacy_hospital_moves_to_an_identity_key_once_with_its_token(hospital_a) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(legacy_public_key="A" * 43 + "=")
    hospital_a.refresh_from_db()
    key = new_identity_key()
    moved = services.agent_identity_move(actor=agent_actor(hospital_a), identity_key=key)
    assert moved.identity_generation == 1 and moved.identity_key == key
    assert moved.legacy_public_key, "kept for the record"
    (event,) = AuditEvent.objects.filter(action="identity.replaced")
    assert event.details["legacy_public_key"] == "A" * 43 + "="
    assert "legacy" in event.details["via"]
    # Asked again with the same key (a crash before the answer was kept): nothing changes.
    again = services.agent_identity_move(actor=agent_actor(moved), identity_key=key)
    assert again.identity_generation == 1
    assert AuditEvent.objects.filter(action="identity.replaced").count() == 1
    # Another key by token: refused (a stolen token cannot replace a pinned key).
    with pytest.raises(Conflict, match="fresh enrolment code"):
        services.agent_identity_move(actor=agent_actor(moved), identity_key=new_identity_key())
    with pytest.raises(InvalidInput):
        services.agent_identity_move(actor=agent_actor(moved), identity_key="AAAA")
    with pytest.raises(PermissionDenied):
        services.agent_identity_move(actor=Actor.system(), identity_key=key)
