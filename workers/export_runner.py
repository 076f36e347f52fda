"""The server's part of an approved export: the job's final server segment, sealed by a
worker to the receiving hospital's export key and left with the coordinator.

The export key is checked against the identity key the coordinator registered for the
receiving hospital (its signature over ``export-N``, the hospital and the key) before
anything is sealed; the blob is signed with the coordinator's export signing key
(``exports/signing.py``), whose public half the receiving agent is given with the export.
What the coordinator stores is the ciphertext and its size.
"""

from __future__ import annotations

import logging

from safetensors.torch import save

from exports.models import SERVER_PART, ExportState, ModelExport
from exports.services import export_key_name, export_server_part_store
from exports.signing import export_signing_key
from kernel.errors import Conflict
from medsplit.protocol.keys import SignedRecipientKey, identity_public_from_b64
from medsplit.protocol.sealing import SealContext, seal
from workers.inference_runner import segment_of

logger = logging.getLogger(__name__)


def segment_bytes(state: dict) -> bytes:
    """A segment's weights and buffers as safetensors, under the model's own names."""

    return save({name: t.detach().clone().contiguous() for name, t in state.items()})


def run(export_id: int) -> str:
    """Seal export ``export_id``'s server segment once; returns what happened."""
    export = ModelExport.objects.select_related("job", "recipient").filter(pk=export_id).first()
    if export is None or export.state != ExportState.APPROVED:
        return "not approved"
    if export.parts.filter(name=SERVER_PART).exists():
        return "already sealed"
    recipient = export.recipient
    name = export_key_name(export.pk)
    # The coordinator checked it when it was published; checked again here, against the
    # identity the coordinator registered, so a row changed since is not sealed to.
    signed = SignedRecipientKey.from_json(
        job=name,
        hospital=recipient.slug,
        data={"key": export.recipient_key, "signature": export.recipient_key_signature},
    )
    plaintext = segment_bytes(segment_of(export.job).party.module.state_dict())
    blob = seal(
        plaintext,
        sender=export_signing_key(),
        recipient=signed,
        recipient_identity=identity_public_from_b64(recipient.identity_key),
        context=SealContext(
            job=name, round=0, sender=SERVER_PART, recipient=recipient.slug, purpose="export"
        ),
    )
    try:
        export_server_part_store(export_id=export.pk, blob=blob)
    except Conflict:  # another worker sealed it first
        return "already sealed"
    logger.info(
        "export %s: server segment sealed for %s (%d bytes)", export.pk, recipient.slug, len(blob)
    )
    return "sealed"
