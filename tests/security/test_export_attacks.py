"""Export by consent against hostile callers of the real coordinator (its API, its
database) and the real worker runner: a hospital outside the job, a sender fetching what
is sealed for the receiver, an upload before every approval, a second upload of a part,
export keys forged or unsigned, a key row swapped behind the coordinator's back. The
receiver's own refusals (a tampered blob, a participant sending other weights than the
job's final ones) are played with real agent processes in
``tests/security/test_export_receiver.py``."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from audit.models import AuditEvent
from exports.models import ExportPart, ModelExport
from hospitals.models import Hospital
from medsplit.errors import SealError
from medsplit.protocol.keys import (
    RecipientKey,
    SignedRecipientKey,
    generate_identity_key,
    identity_public_b64,
    identity_public_from_b64,
)
from medsplit.protocol.sealing import SealContext, unseal
from tests.platform_apps.conftest import make_hospital
from workers import export_runner

pytestmark = pytest.mark.django_db


def _identities(hospitals: list[Hospital]) -> dict[str, MLDSA65PrivateKey]:
    keys = {}
    for hospital in hospitals:
        keys[hospital.slug] = generate_identity_key()
        hospital.identity_key = identity_public_b64(keys[hospital.slug])
        hospital.save(update_fields=["identity_key"])
    return keys


def _signed(export_id: int, slug: str, identity: MLDSA65PrivateKey) -> tuple[RecipientKey, dict]:
    key = RecipientKey.generate()
    signed = SignedRecipientKey.sign(
        job=f"export-{export_id}", hospital=slug, key=key.public(), identity=identity
    )
    return key, signed.to_json()


@pytest.fixture
def export(make_job, three_hospitals, admin_actor, client_for, consortium_admin):
    job = make_job("completed")
    made = client_for(consortium_admin).post(
        f"/api/jobs/{job.pk}/exports/", {"recipient": three_hospitals[0].slug}, format="json"
    )
    assert made.status_code == 201, made.content
    return ModelExport.objects.get(pk=made.json()["id"])


def _upload(client, export_id: int, blob: bytes = b"sealed bytes"):
    return client.post(
        f"/api/agent/exports/{export_id}/parts/", blob, content_type="application/octet-stream"
    )


def test_export_keys_only_the_recipient_publishes_signed_by_its_own_identity(
    export, three_hospitals, agent_client
) -> None:
    keys = _identities(three_hospitals)
    receiver, other = three_hospitals[0], three_hospitals[1]
    url = f"/api/agent/exports/{export.pk}/key/"
    # Another participant publishes a key of its own for the receiver's export.
    _, theirs = _signed(export.pk, other.slug, keys[other.slug])
    assert agent_client(other).post(url, theirs, format="json").status_code == 403
    # Signed by another hospital's identity, claiming the receiver's name.
    _, forged = _signed(export.pk, receiver.slug, keys[other.slug])
    answer = agent_client(receiver).post(url, forged, format="json")
    assert answer.status_code == 400 and "not signed by its pinned" in answer.content.decode()
    # Unsigned, or a job's per-job key replayed as the export key.
    unsigned = agent_client(receiver).post(url, {"key": forged["key"]}, format="json")
    assert unsigned.status_code == 400
    job_key = SignedRecipientKey.sign(
        job=f"job-{export.job_id}",
        hospital=receiver.slug,
        key=RecipientKey.generate().public(),
        identity=keys[receiver.slug],
    ).to_json()
    assert agent_client(receiver).post(url, job_key, format="json").status_code == 400
    # The receiver cannot approve before its key is there.
    early = agent_client(receiver).post(f"/api/agent/exports/{export.pk}/approve/")
    assert early.status_code == 409 and "publishes its export key" in early.content.decode()
    export.refresh_from_db()
    assert export.recipient_key == ""


def test_parts_go_in_only_from_participants_after_every_approval_once_and_out_only_to_the_recipient(
    export, three_hospitals, agent_client
) -> None:
    keys = _identities(three_hospitals)
    receiver, sender, third = three_hospitals
    _, published = _signed(export.pk, receiver.slug, keys[receiver.slug])
    assert (
        agent_client(receiver)
        .post(f"/api/agent/exports/{export.pk}/key/", published, format="json")
        .status_code
        == 201
    )
    agent_client(receiver).post(f"/api/agent/exports/{export.pk}/approve/")
    agent_client(sender).post(f"/api/agent/exports/{export.pk}/approve/")
    before = _upload(agent_client(sender), export.pk)
    assert before.status_code == 409 and "only once every" in before.content.decode()
    agent_client(third).post(f"/api/agent/exports/{export.pk}/approve/")

    outsider = make_hospital("outsider")
    assert _upload(agent_client(outsider), export.pk).status_code == 403
    assert _upload(agent_client(receiver), export.pk).status_code == 409
    assert _upload(agent_client(sender), export.pk, b"first").status_code == 201
    again = _upload(agent_client(sender), export.pk, b"second")
    assert again.status_code == 409 and "already sealed" in again.content.decode()

    part_url = f"/api/agent/exports/{export.pk}/parts/{sender.slug}/"
    for who in (sender, third, outsider):
        assert agent_client(who).get(part_url).status_code == 403
    fetched = agent_client(receiver).get(part_url)
    assert fetched.status_code == 200 and fetched.content == b"first"
    part = ExportPart.objects.get(name=sender.slug)
    assert bytes(part.ciphertext) == b"first" and part.size_bytes == 5
    sealed = AuditEvent.objects.get(action="export.part_sealed")
    assert sealed.details == {"part": sender.slug, "size_bytes": 5, "sha256": part.sha256}


def test_the_worker_seals_the_server_segment_only_to_a_key_the_recipients_identity_signed(
    export, three_hospitals, agent_client, settings, tmp_path
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "CHECKPOINT_DIR": tmp_path / "checkpoints"}
    keys = _identities(three_hospitals)
    receiver = three_hospitals[0]
    key, published = _signed(export.pk, receiver.slug, keys[receiver.slug])
    agent_client(receiver).post(f"/api/agent/exports/{export.pk}/key/", published, format="json")
    for hospital in three_hospitals:
        agent_client(hospital).post(f"/api/agent/exports/{export.pk}/approve/")

    # The key row swapped in the database (past the coordinator's check at publication).
    _, swapped = _signed(export.pk, receiver.slug, keys[three_hospitals[1].slug])
    ModelExport.objects.filter(pk=export.pk).update(
        recipient_key=swapped["key"], recipient_key_signature=swapped["signature"]
    )
    with pytest.raises(SealError, match="not signed by its pinned identity"):
        export_runner.run(export.pk)
    assert not ExportPart.objects.exists()

    ModelExport.objects.filter(pk=export.pk).update(
        recipient_key=published["key"], recipient_key_signature=published["signature"]
    )
    assert export_runner.run(export.pk) == "sealed"
    assert export_runner.run(export.pk) == "already sealed"
    blob = bytes(ExportPart.objects.get(name="server").ciphertext)
    info = agent_client(receiver).get(f"/api/agent/exports/{export.pk}/").json()
    context = SealContext(
        job=f"export-{export.pk}",
        round=0,
        sender="server",
        recipient=receiver.slug,
        purpose="export",
    )
    assert unseal(
        blob,
        recipient=key,
        sender=identity_public_from_b64(info["server_identity"]),
        context=context,
    )
    tampered = bytearray(blob)
    tampered[len(blob) // 2] ^= 1
    with pytest.raises(SealError, match="failed authentication"):
        unseal(
            bytes(tampered),
            recipient=key,
            sender=identity_public_from_b64(info["server_identity"]),
            context=context,
        )
