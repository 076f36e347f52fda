"""Sealing a hospital's hand-off for another hospital, so that only ciphertext crosses the relay.

After its turn a hospital hands its training state to the other participants through the
relay; the coordinator and the relay must only ever see ciphertext, and must not be able to
read it later either: medical data stays sensitive for decades. So each blob is

* encrypted with HPKE (RFC 9180) in base mode, suite ``MLKEM768_X25519`` / HKDF-SHA256 /
  AES-256-GCM, to the recipient's **per-job** key (:class:`medsplit.protocol.keys.RecipientKey`),
  which the recipient deletes once the job has ended: a key stolen afterwards opens no
  recorded blob, and a quantum computer must break ML-KEM-768 as well as X25519;
* signed with the sender's ML-DSA-65 **identity** key over every byte before the signature,
  so the recipient knows which hospital sealed it (HPKE's base mode alone says nothing
  about the sender).

The sender seals only to a recipient key signed by the recipient's pinned identity key
(:class:`~medsplit.protocol.keys.SignedRecipientKey`); the recipient opens only a blob
signed by the sender's pinned identity key. A coordinator that hands out keys of its own
is refused on both sides.

Layout of a sealed blob (integers big-endian)::

    offset      size    field
    0           8       magic  b"MSPLSEAL"
    8           1       format version (2)
    9           2       header length H
    11          H       header: the canonical context the sender sealed for (ASCII JSON)
    11+H        32      SHA-256 of the recipient public key it was sealed to
    43+H        32      the sender's identity fingerprint (SHA-256 of its public key)
    75+H        1120    HPKE encapsulated key (ML-KEM-768 ciphertext, X25519 share)
    1195+H      n+16    AES-256-GCM ciphertext of the n plaintext bytes, then the tag
    end-3309    3309    ML-DSA-65 signature (context ``medsplit/seal/v2``) of the
                        SHA-256 of every byte before it

Everything before the encapsulated key (the *prefix*) is also the HPKE ``info``, which the
recipient builds from what it expects, so it is bound into the key schedule as well as
signed. The header is not trusted: it lets :func:`unseal` say *why* a blob does not fit (a
blob replayed from an earlier round, say). Callers build the expected context from what
they know (the job, round and parties the coordinator scheduled), never from the blob.

Format version 1 was static-static X25519 + HKDF + AES-GCM; it is no longer written or read.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey

from medsplit.errors import SealError
from medsplit.protocol.keys import (
    SIGNATURE_BYTES,
    RecipientKey,
    SignedRecipientKey,
    fingerprint,
    format_fingerprint,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_PLAINTEXT_BYTES",
    "OVERHEAD_BYTES",
    "PURPOSES",
    "SealContext",
    "seal",
    "unseal",
]

MAGIC = b"MSPLSEAL"
"""The first bytes of every sealed blob."""

FORMAT_VERSION = 2
"""The blob format this module writes and reads."""

LEGACY_VERSION = 1
"""Static X25519 keys (MedSplit before per-job keys): recognised only to say so."""

PURPOSES = frozenset(
    {
        "handoff",
        "final",
        "secagg-pair",
        "secagg-group",
        "psi-request",
        "psi-reply",
        "alignment",
        "leakage-scores",
        "export",
    }
)
"""``handoff``: state passed to the next hospital; ``final``: the weights every participant
receives at the end of a job; ``secagg-pair`` and ``secagg-group``: a pairwise mask seed
and the group mask key of secure aggregation (:mod:`medsplit.secagg.masks`);
``psi-request``, ``psi-reply`` and ``alignment``: a vertical job's record alignment, its
PSI messages and the K-way intersection handed on (``hospital_agent/alignment.py``);
``leakage-scores``: a passive party's label-leakage scores for the label party
(``hospital_agent/leakage.py``); ``export``: a segment of a completed job's model sealed to
the receiving hospital's export key (``hospital_agent/export_flow.py``)."""

SUITE = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
"""The HPKE suite of every blob."""

ENC_BYTES = hpke.KEM.MLKEM768_X25519.enc_length()
DIGEST_BYTES = 32
TAG_BYTES = 16
MAX_FIELD_CHARS = 256
"""The longest job id, sender or recipient name a context accepts."""

# AES-GCM in ``cryptography`` takes at most 2**31 - 1 bytes, and the ciphertext carries the tag.
MAX_PLAINTEXT_BYTES = 2**31 - 1 - TAG_BYTES
"""The largest plaintext :func:`seal` accepts (just under 2 GiB)."""

SIGNING_CONTEXT = b"medsplit/seal/v2"
_LENGTH_BYTES = 2
_PREFIX_BYTES = len(MAGIC) + 1 + _LENGTH_BYTES
OVERHEAD_BYTES = _PREFIX_BYTES + 2 * DIGEST_BYTES + ENC_BYTES + TAG_BYTES + SIGNATURE_BYTES
"""A blob's size beyond its plaintext and its header (4,520 bytes)."""
_MAX_ROUND = 2**63 - 1
_FIELDS = ("job", "round", "sender", "recipient", "purpose")


@dataclass(frozen=True)
class SealContext:
    """What a sealed blob is for: job, round, sender, recipient and purpose.

    The sender seals for a context and the recipient unseals expecting one; the blob opens
    only when the two are equal, so a blob replayed into another round or job, or delivered
    to the wrong hospital, is refused.

    Attributes:
        job: the job's id.
        round: the round (turn) the blob was produced after, from 0.
        sender: the id of the hospital sealing the blob.
        recipient: the id of the hospital the blob is sealed for.
        purpose: ``"handoff"`` (to the next hospital), ``"final"`` (final weights), or one
            of secure aggregation's (see :data:`PURPOSES`).

    Raises:
        SealError: a field is empty, too long, holds control characters, ``round`` is not
            a non-negative integer, or ``purpose`` is not one of :data:`PURPOSES`.
    """

    job: str
    round: int
    sender: str
    recipient: str
    purpose: str = "handoff"

    def __post_init__(self) -> None:
        for name in ("job", "sender", "recipient"):
            _check_text(name, getattr(self, name))
        if isinstance(self.round, bool) or not isinstance(self.round, int):
            raise SealError(f"context round must be an integer, got {type(self.round).__name__}")
        if not 0 <= self.round <= _MAX_ROUND:
            raise SealError(f"context round must be between 0 and 2**63 - 1, got {self.round}")
        if self.purpose not in PURPOSES:
            raise SealError(
                f"context purpose must be one of {sorted(PURPOSES)}, got {_show(self.purpose)}"
            )

    def canonical_bytes(self) -> bytes:
        """The context as compact JSON with sorted keys and ASCII escapes: one encoding per
        context, used as the blob header, in the HPKE info and under the signature."""
        return _canonical(self._as_dict())

    def _as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}


def seal(
    plaintext: bytes,
    *,
    sender: MLDSA65PrivateKey,
    recipient: SignedRecipientKey,
    recipient_identity: MLDSA65PublicKey,
    context: SealContext,
) -> bytes:
    """Encrypt ``plaintext`` so that only the holder of ``recipient``'s private key can read
    it, and sign it so that it can tell it came from ``sender`` for ``context``.

    Args:
        plaintext: the bytes to seal (bytes-like), up to :data:`MAX_PLAINTEXT_BYTES`.
        sender: the sealing agent's own identity key.
        recipient: the recipient's per-job key as published, with its signature.
        recipient_identity: the recipient's identity key as this agent pinned it; the
            recipient key must be signed by it for ``context``'s job and recipient.
        context: the job, round, parties and purpose this blob is for.

    Returns:
        The sealed blob (see the module docstring for its layout): ``len(plaintext)`` +
        :data:`OVERHEAD_BYTES` + the length of the canonical context.

    Raises:
        SealError: the recipient key is unsigned, not signed by ``recipient_identity``, or
            published for another job or hospital than ``context`` names; the plaintext is
            too large.
    """
    if not isinstance(sender, MLDSA65PrivateKey):
        raise TypeError(
            f"expected an MLDSA65PrivateKey for this agent, got {type(sender).__name__}"
        )
    if not isinstance(recipient, SignedRecipientKey):
        raise TypeError(
            f"expected a SignedRecipientKey for the other hospital, got {type(recipient).__name__}"
        )
    _check_context(context)
    if (recipient.job, recipient.hospital) != (context.job, context.recipient):
        raise SealError(
            f"the recipient key was published by {_show(recipient.hospital)} for "
            f"{_show(recipient.job)}, but this blob is for {_show(context.recipient)} in "
            f"{_show(context.job)}: refusing to seal to it"
        )
    key = recipient.verify(recipient_identity)
    if not isinstance(plaintext, bytes | bytearray | memoryview):
        raise TypeError(f"expected the plaintext as bytes, got {type(plaintext).__name__}")
    size = memoryview(plaintext).nbytes
    if size > MAX_PLAINTEXT_BYTES:
        raise SealError(
            f"cannot seal {size} bytes in one blob, at most {MAX_PLAINTEXT_BYTES}: "
            "split the state into several blobs"
        )
    prefix = _prefix(context, bytes.fromhex(key.sha256()), bytes.fromhex(fingerprint(sender)))
    sealed = SUITE.encrypt(plaintext, key.hpke(), info=prefix)  # enc, then ciphertext and tag
    digest = hashlib.sha256(prefix)
    digest.update(sealed)
    # The signature covers a SHA-256 of the blob, not the blob: ML-DSA would hash hundreds
    # of megabytes with SHAKE256 twice, several times slower, for no more assurance.
    signature = sender.sign(digest.digest(), SIGNING_CONTEXT)
    return b"".join((prefix, sealed, signature))


def unseal(
    blob: bytes,
    *,
    recipient: RecipientKey,
    sender: MLDSA65PublicKey,
    context: SealContext,
) -> bytes:
    """Open a blob :func:`seal` made, checking it is signed by ``sender`` for ``context``.

    Args:
        blob: the sealed bytes as received from the relay (bytes-like).
        recipient: this agent's own per-job key for the job.
        sender: the identity key of the hospital the blob should come from, as this agent
            pinned it.
        context: what this agent expects the blob to be for, built from its own knowledge
            of the job (never from the blob).

    Returns:
        The plaintext.

    Raises:
        SealError: the bytes are not a sealed blob, have an unsupported format version, are
            truncated, were sealed for another context (replayed or misplaced: the message
            names the fields that differ), to another key of this hospital, by another
            identity than ``sender``'s, or fail authentication (altered, or forged).
    """
    if not isinstance(recipient, RecipientKey):
        raise TypeError(f"expected a RecipientKey for this agent, got {type(recipient).__name__}")
    if not isinstance(sender, MLDSA65PublicKey):
        raise TypeError(
            f"expected an MLDSA65PublicKey for the other hospital, got {type(sender).__name__}"
        )
    _check_context(context)
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"expected the sealed blob as bytes, got {type(blob).__name__}")
    view = memoryview(blob).cast("B")
    size = len(view)
    if size < len(MAGIC):
        if MAGIC.startswith(bytes(view)):
            raise _truncated(size, _PREFIX_BYTES)
        raise _not_a_blob()
    if view[: len(MAGIC)] != MAGIC:
        raise _not_a_blob()
    if size < _PREFIX_BYTES:
        raise _truncated(size, _PREFIX_BYTES)
    version = view[len(MAGIC)]
    if version == LEGACY_VERSION:
        raise SealError(
            "this blob was sealed with the static X25519 keys of earlier MedSplit releases "
            "(format version 1), which this agent no longer opens: hand-offs are sealed to "
            "per-job keys now (format 2). Run the job again once every agent is upgraded."
        )
    if version != FORMAT_VERSION:
        raise SealError(
            f"sealed blob has format version {version}, this MedSplit reads version "
            f"{FORMAT_VERSION}: the sender and this agent run incompatible MedSplit releases"
        )
    header_size = int.from_bytes(view[len(MAGIC) + 1 : _PREFIX_BYTES], "big")
    body = _PREFIX_BYTES + header_size
    minimum = body + 2 * DIGEST_BYTES + ENC_BYTES + TAG_BYTES + SIGNATURE_BYTES
    if size < minimum:
        raise _truncated(size, minimum)
    header = bytes(view[_PREFIX_BYTES:body])
    if header != context.canonical_bytes():
        raise _mismatch(header, context)
    own = recipient.public().sha256()
    sealed_to = bytes(view[body : body + DIGEST_BYTES]).hex()
    if sealed_to != own:
        raise SealError(
            f"this blob from {_show(context.sender)} was sealed to another recipient key "
            f"(sha256 {sealed_to[:16]}...) than this agent's key for {_show(context.job)} "
            f"(sha256 {own[:16]}...): the sender was given a swapped or stale key for "
            f"{_show(context.recipient)}. Do not load it; ask the sender to hand off again."
        )
    signer = bytes(view[body + DIGEST_BYTES : body + 2 * DIGEST_BYTES]).hex()
    pinned = fingerprint(sender)
    if signer != pinned:
        raise SealError(
            f"this blob claims to come from {_show(context.sender)} but names the identity "
            f"{format_fingerprint(signer)}, not the one pinned for {_show(context.sender)} "
            f"({format_fingerprint(pinned)}): a third party sealed it, or the identity "
            "changed without a re-enrolment. Do not load it."
        )
    signed = view[: size - SIGNATURE_BYTES]
    try:
        sender.verify(
            bytes(view[size - SIGNATURE_BYTES :]),
            hashlib.sha256(signed).digest(),
            SIGNING_CONTEXT,
        )
    except InvalidSignature:
        raise _failed(context, "its signature does not verify") from None
    prefix = _prefix(context, bytes.fromhex(own), bytes.fromhex(pinned))
    try:
        return SUITE.decrypt(signed[len(prefix) :], recipient.hpke(), info=prefix)
    except InvalidTag:
        raise _failed(context, "it does not decrypt with this agent's key") from None


def _prefix(context: SealContext, recipient_sha256: bytes, sender_fingerprint: bytes) -> bytes:
    """Everything before the HPKE encapsulation: what the HPKE info binds and both sides
    build from what they know."""
    header = context.canonical_bytes()
    return b"".join(
        (
            MAGIC,
            bytes([FORMAT_VERSION]),
            len(header).to_bytes(_LENGTH_BYTES, "big"),
            header,
            recipient_sha256,
            sender_fingerprint,
        )
    )


def _failed(context: SealContext, why: str) -> SealError:
    return SealError(
        f"sealed {context.purpose} blob for round {context.round} of job "
        f"{_show(context.job)} failed authentication ({why}): either it was altered on the "
        f"way (in the relay or in transit), or it was not sealed by {_show(context.sender)} "
        "for this agent's key. Do not load it; ask the sender to hand off again."
    )


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode(
        "ascii"
    )


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise SealError(f"context {name} must be a string, got {type(value).__name__}")
    if not value:
        raise SealError(f"context {name} must not be empty")
    if len(value) > MAX_FIELD_CHARS:
        raise SealError(
            f"context {name} has {len(value)} characters, at most {MAX_FIELD_CHARS} are allowed"
        )
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise SealError(
            f"context {name} {_show(value)} holds control characters or lone surrogates"
        )


def _check_context(context: object) -> None:
    if not isinstance(context, SealContext):
        raise TypeError(f"expected a SealContext, got {type(context).__name__}")


def _show(value: object, limit: int = 80) -> str:
    """``repr`` of a value for a message, escaped and cut short (it may come from a blob)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _truncated(size: int, needed: int) -> SealError:
    return SealError(
        f"sealed blob is truncated: {size} bytes, at least {needed} needed. The transfer was "
        "cut short or the relay entry was overwritten; ask the sender to hand off again."
    )


def _not_a_blob() -> SealError:
    return SealError(
        f"these bytes are not a sealed MedSplit blob (they do not start with {MAGIC!r}): "
        "the sender did not seal them, or the relay returned something else"
    )


def _mismatch(header: bytes, expected: SealContext) -> SealError:
    """The error for a blob whose header names another context than the expected one."""
    try:
        sealed = json.loads(header.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        sealed = None
    if not isinstance(sealed, dict) or set(sealed) != set(_FIELDS):
        return SealError(
            "sealed blob has an unreadable context header: it was altered, or it is not a "
            "MedSplit hand-off. Do not load it; ask the sender to hand off again."
        )
    wanted = expected._as_dict()
    differing = [name for name in _FIELDS if sealed[name] != wanted[name]]
    if not differing:  # same values, other bytes: not what seal() writes
        return SealError(
            "sealed blob has a context header in non-canonical form: it was altered. "
            "Do not load it; ask the sender to hand off again."
        )
    found = ", ".join(f"{name} {_show(sealed[name])}" for name in differing)
    wanted_text = ", ".join(f"{name} {_show(wanted[name])}" for name in differing)
    of_job = "" if "job" in differing else f" of job {_show(expected.job)}"
    return SealError(
        f"this blob was sealed for {found}{of_job}, expected {wanted_text}: a replayed or "
        f"misplaced blob ({', '.join(differing)} differ{'s' if len(differing) == 1 else ''}). "
        "Do not load it; ask the coordinator which hand-off is current."
    )
