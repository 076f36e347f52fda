"""The secrets one hospital seals for another in one round attempt, as one relay blob.

A hospital puts one blob per recipient on the relay (the ``mask-seed`` mail topic): its
pair seed for that recipient, and, from the round's leader, the group key. Each secret is
sealed on its own (:mod:`.masks`), bound to the round attempt, the pair and its kind; the
envelope only carries them, in canonical ASCII JSON::

    {"format": 1, "round_digest": "<hex>", "sender": "<slug>", "recipient": "<slug>",
     "secrets": [{"kind": "secagg-pair" | "secagg-group", "blob": "<base64>"}, ...]}

:func:`open_envelope` refuses any other shape, and an envelope of another attempt is told
apart (:class:`StaleEnvelope`) so that a reader can wait for the one it expects: the
relay keeps one blob per sender and recipient, and the last attempt's may still be there.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from medsplit.secagg.errors import MessageError
from medsplit.secagg.hospital import SealedSecret
from medsplit.secagg.masks import GROUP, PAIR
from medsplit.secagg.rounds import RoundId

__all__ = ["ENVELOPE_FORMAT", "MAX_ENVELOPE_BYTES", "StaleEnvelope", "open_envelope", "pack"]

ENVELOPE_FORMAT = 1
#: Two sealed 32-byte secrets take about 10 KiB (ML-KEM ciphertext, ML-DSA signature).
MAX_ENVELOPE_BYTES = 64 * 1024
_KEYS = ["format", "recipient", "round_digest", "secrets", "sender"]


class StaleEnvelope(MessageError):
    """A well-formed envelope of another round attempt (the relay still holds it)."""


def pack(round_id: RoundId, secrets: Sequence[SealedSecret]) -> bytes:
    """The envelope of ``secrets``, all from one sender to one recipient.

    Raises:
        MessageError: no secret, or they do not share one sender and one recipient.
    """
    pairs = {(s.sender, s.recipient) for s in secrets}
    if len(pairs) != 1:
        raise MessageError("an envelope carries the secrets of one sender for one recipient")
    ((sender, recipient),) = pairs
    body = {
        "format": ENVELOPE_FORMAT,
        "recipient": recipient,
        "round_digest": round_id.digest(),
        "secrets": [
            {"kind": s.kind, "blob": base64.b64encode(s.blob).decode("ascii")} for s in secrets
        ],
        "sender": sender,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")


def open_envelope(
    data: bytes, *, round_id: RoundId, sender: str, recipient: str
) -> list[SealedSecret]:
    """The sealed secrets in ``data``, which ``sender`` put for ``recipient`` in ``round_id``.

    Raises:
        StaleEnvelope: a valid envelope of another round attempt.
        MessageError: not an envelope, or one that names another sender or recipient.
    """
    if not isinstance(data, bytes) or len(data) > MAX_ENVELOPE_BYTES:
        raise MessageError(f"a secrets envelope is at most {MAX_ENVELOPE_BYTES} bytes")
    try:
        body = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise MessageError(f"the secrets from {sender!r} are not an envelope") from None
    if not isinstance(body, dict) or sorted(body) != _KEYS:
        raise MessageError(f"the envelope from {sender!r} must hold exactly {_KEYS}")
    if body["format"] != ENVELOPE_FORMAT:
        raise MessageError(
            f"the envelope from {sender!r} has format {body['format']!r}, this MedSplit "
            f"reads {ENVELOPE_FORMAT}"
        )
    if (body["sender"], body["recipient"]) != (sender, recipient):
        raise MessageError(
            f"the envelope at {sender!r}'s key for {recipient!r} names "
            f"{body['sender']!r:.80} to {body['recipient']!r:.80}"
        )
    if body["round_digest"] != round_id.digest():
        raise StaleEnvelope(
            f"the envelope from {sender!r} is of another round attempt than round "
            f"{round_id.round} attempt {round_id.attempt}"
        )
    secrets = body["secrets"]
    if not isinstance(secrets, list) or not 1 <= len(secrets) <= 2:
        raise MessageError(f"the envelope from {sender!r} must carry one or two secrets")
    out = []
    for item in secrets:
        if not isinstance(item, dict) or sorted(item) != ["blob", "kind"]:
            raise MessageError(f"a secret in the envelope from {sender!r} is malformed")
        if item["kind"] not in (PAIR, GROUP) or not isinstance(item["blob"], str):
            raise MessageError(f"a secret in the envelope from {sender!r} is malformed")
        try:
            blob = base64.b64decode(item["blob"], validate=True)
        except binascii.Error:
            raise MessageError(f"a secret in the envelope from {sender!r} is not base64") from None
        out.append(SealedSecret(item["kind"], sender, recipient, blob))
    return out
