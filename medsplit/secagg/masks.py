"""Masks that hide each hospital's vector from everyone but the hospitals.

* A **pairwise mask** (Bonawitz et al., CCS 2017) for each pair of participants ``a < b``
  (sorted names): ``a`` draws a 32-byte seed (:func:`draw_secret`, the OS's CSPRNG) and
  seals it to ``b`` (:func:`seal_secret`). Both expand it into the same vector; ``a`` adds
  it, ``b`` subtracts it, so the pair's masks cancel in the sum.
* A **group mask** from a 32-byte group key that the round's leader (the first
  participant) draws and seals to every other participant. The leader adds it to its
  vector; every hospital subtracts it from the aggregate. So the aggregator (and the
  coordinator and relay) see neither a single vector nor the sum: the pairwise masks hide
  each vector, the group mask the sum. One mask added once, not one per hospital: ``K·G``
  would not be uniform in Z/2^64 for even ``K`` (its low bit is 0), and a mask of each
  hospital's own would cost every hospital ``K`` expansions to remove for no more secrecy
  (every hospital holds the key).

Expansion: the ChaCha20 key stream (``cryptography``) under a key derived with
HKDF-SHA256 from the secret, whose ``info`` binds the purpose, the whole round
(:meth:`~medsplit.secagg.rounds.RoundId.binding`: job, round, attempt, participants and
weights), the ordered pair (or the leader) and the vector length; read as little-endian
``uint64``. Each derived key is used for one stream only, so the nonce is fixed at zero.
Never ``random`` nor numpy's generators: their output is predictable from a few values.

Sealed secrets use :func:`medsplit.protocol.sealing.seal` with the purposes
``secagg-pair`` and ``secagg-group`` (never ``handoff``), and their plaintext repeats the
round's digest, the kind and the two parties, which the recipient checks: a seed of an
earlier attempt of the same round (same sealing context) is refused.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from medsplit.errors import SealError
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey
from medsplit.protocol.sealing import SealContext, seal, unseal
from medsplit.secagg.errors import SecAggError, SeedError
from medsplit.secagg.rounds import RoundId

__all__ = [
    "GROUP",
    "PAIR",
    "SECRET_BYTES",
    "draw_secret",
    "group_mask",
    "keystream_u64",
    "open_secret",
    "pair_mask",
    "seal_secret",
]

SECRET_BYTES = 32
PAIR = "pair"
GROUP = "group"
_PURPOSE = {PAIR: "secagg-pair", GROUP: "secagg-group"}
_LABEL = {PAIR: b"medsplit/secagg/pair-mask/v1", GROUP: b"medsplit/secagg/group-mask/v1"}
_SECRET_MAGIC = b"MSSASECR"
_SECRET_VERSION = 1
_MAX_LENGTH = 2**31  # the 32-bit ChaCha20 block counter covers 2**32 blocks of 8 values


def draw_secret() -> bytes:
    """A fresh 32-byte seed or group key from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def keystream_u64(key: bytes, length: int) -> np.ndarray:
    """``length`` little-endian ``uint64`` values of the ChaCha20 key stream under ``key``
    (32 bytes, used for this one stream only, so the nonce is zero)."""
    if not isinstance(key, bytes) or len(key) != SECRET_BYTES:
        raise SecAggError(f"a ChaCha20 key has {SECRET_BYTES} bytes")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= _MAX_LENGTH:
        raise SecAggError(f"a mask length must be an integer from 0 to 2**31, got {length!r}")
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(8 * length))
    encryptor.finalize()  # a stream cipher keeps nothing back
    # Read-only, and no copy on a little-endian machine: callers only add it to vectors.
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64, copy=False)


def pair_mask(seed: bytes, round_id: RoundId, low: str, high: str, length: int) -> np.ndarray:
    """The mask of the pair ``low < high`` in ``round_id``: ``low`` adds it, ``high``
    subtracts it."""
    if not low < high or {low, high} - set(round_id.participants):
        raise SecAggError(f"({low!r}, {high!r}) is not an ordered pair of this round")
    return keystream_u64(_derive(seed, PAIR, round_id, [low, high], length), length)


def group_mask(group_key: bytes, round_id: RoundId, length: int) -> np.ndarray:
    """The group mask of ``round_id``: the leader adds it, the hospitals remove it from
    the aggregate."""
    return keystream_u64(_derive(group_key, GROUP, round_id, [round_id.leader], length), length)


def _derive(secret: bytes, kind: str, round_id: RoundId, parties: list[str], length: int) -> bytes:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise SecAggError(f"a mask secret has {SECRET_BYTES} bytes")
    info = b"\x00".join(
        (
            _LABEL[kind],
            round_id.binding(),
            json.dumps([parties, length], separators=(",", ":"), ensure_ascii=True).encode(),
        )
    )
    return HKDF(algorithm=hashes.SHA256(), length=SECRET_BYTES, salt=None, info=info).derive(secret)


@dataclass(frozen=True)
class _SecretHeader:
    """What a sealed secret says it is for; the recipient compares it to what it expects."""

    kind: str
    round_digest: str
    sender: str
    recipient: str

    def to_bytes(self) -> bytes:
        fields = {
            "kind": self.kind,
            "recipient": self.recipient,
            "round": self.round_digest,
            "sender": self.sender,
        }
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return text.encode("ascii")


def _plaintext(header: _SecretHeader, secret: bytes) -> bytes:
    head = header.to_bytes()
    return b"".join(
        (_SECRET_MAGIC, bytes([_SECRET_VERSION]), len(head).to_bytes(2, "big"), head, secret)
    )


def _context(round_id: RoundId, kind: str, sender: str, recipient: str) -> SealContext:
    return SealContext(round_id.job, round_id.round, sender, recipient, _PURPOSE[kind])


def _check_kind(kind: str, round_id: RoundId, sender: str, recipient: str) -> None:
    if kind not in _PURPOSE:
        raise SecAggError(f"a secret is {PAIR!r} or {GROUP!r}, got {kind!r}")
    if sender == recipient or {sender, recipient} - set(round_id.participants):
        raise SeedError(
            f"a secret goes from one participant to another, not {sender!r} to {recipient!r}"
        )
    if kind == PAIR and not sender < recipient:
        raise SeedError(
            f"the pair seed of {recipient!r} and {sender!r} is drawn by {recipient!r}, the "
            "first of the two in sorted order"
        )
    if kind == GROUP and sender != round_id.leader:
        raise SeedError(
            f"the group key is drawn by the round's leader {round_id.leader!r}, not {sender!r}"
        )


def seal_secret(
    secret: bytes,
    *,
    kind: str,
    round_id: RoundId,
    sender: str,
    recipient: str,
    identity: MLDSA65PrivateKey,
    recipient_key: SignedRecipientKey,
    recipient_identity: MLDSA65PublicKey,
) -> bytes:
    """Seal a pair seed (``kind`` :data:`PAIR`) or the group key (:data:`GROUP`) from
    ``sender`` to ``recipient`` for ``round_id``, as hand-offs are sealed.

    Raises:
        SeedError: the pair is not ordered, the group key is not from the leader.
        SealError: the recipient key is not signed by its pinned identity (see ``seal``).
    """
    _check_kind(kind, round_id, sender, recipient)
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise SecAggError(f"a mask secret has {SECRET_BYTES} bytes")
    header = _SecretHeader(kind, round_id.digest(), sender, recipient)
    return seal(
        _plaintext(header, secret),
        sender=identity,
        recipient=recipient_key,
        recipient_identity=recipient_identity,
        context=_context(round_id, kind, sender, recipient),
    )


def open_secret(
    blob: bytes,
    *,
    kind: str,
    round_id: RoundId,
    sender: str,
    recipient: str,
    recipient_key: RecipientKey,
    sender_identity: MLDSA65PublicKey,
) -> bytes:
    """Open what :func:`seal_secret` sealed, checking it is for this kind, round attempt
    and pair.

    Raises:
        SeedError: the blob does not open (altered, forged, sealed to another key, for
            another context), or was sealed for another attempt, participant set or pair.
    """
    _check_kind(kind, round_id, sender, recipient)
    try:
        plain = unseal(
            blob,
            recipient=recipient_key,
            sender=sender_identity,
            context=_context(round_id, kind, sender, recipient),
        )
    except SealError as e:
        raise SeedError(f"the {kind} secret from {sender!r} does not open: {e}") from e
    expected = _plaintext(_SecretHeader(kind, round_id.digest(), sender, recipient), bytes(32))
    head = expected[:-SECRET_BYTES]
    if len(plain) != len(expected) or plain[: len(head)] != head:
        raise SeedError(
            f"the {kind} secret from {sender!r} was made for another attempt, participant "
            f"set or pair of round {round_id.round} of {round_id.job!r} (round digest "
            f"expected {round_id.digest()[:16]}...): a replayed seed; do not use it"
        )
    return bytes(plain[len(head) :])
