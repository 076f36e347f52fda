"""Sealing a hospital's hand-off for the next hospital, so that only ciphertext crosses the relay.

After its turn a hospital hands its training state to the next hospital through the relay;
the coordinator and the relay must only ever see ciphertext. Each agent has a static X25519
key pair generated locally (the private key never leaves it) and learns the other agents'
public keys from the coordinator.

A blob is sealed with a key only the two parties can derive:

* X25519 between the sender's static private key and the recipient's static public key
  (this also authenticates the sender: nobody else can derive the same secret);
* HKDF-SHA256 of that secret with a random 32-byte salt per blob and an ``info`` made of
  the protocol label, both public keys and the canonical :class:`SealContext`;
* AES-256-GCM with a random 12-byte nonce, the canonical context as associated data.

Layout of a sealed blob (integers big-endian)::

    offset    size   field
    0         8      magic  b"MSPLSEAL"
    8         1      format version (1)
    9         2      header length H
    11        H      header: the canonical context the sender sealed for (ASCII JSON)
    11+H      32     HKDF salt
    43+H      12     AES-GCM nonce
    55+H      n+16   ciphertext of the n plaintext bytes, then the 16-byte GCM tag

The header is not trusted. It only lets :func:`unseal` say *why* a blob does not fit (for
example a blob replayed from an earlier round); the context the receiver expects is what
goes into the key derivation and the associated data, so changing any byte of the header,
salt, nonce or ciphertext makes authentication fail.

Because static-static X25519 gives A and B the same secret in both directions, it is the
sender and recipient names in the context that keep a blob from A to B from being passed
off as one from B to A: callers must build the expected context from what they know (the
job, round and parties the coordinator scheduled), never from the blob.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import unicodedata
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from medsplit.errors import SealError

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_PLAINTEXT_BYTES",
    "PURPOSES",
    "SealContext",
    "generate_private_key",
    "private_key_from_bytes",
    "private_key_to_bytes",
    "public_key_b64",
    "public_key_from_b64",
    "seal",
    "unseal",
]

MAGIC = b"MSPLSEAL"
"""The first bytes of every sealed blob."""

FORMAT_VERSION = 1
"""The blob format this module writes and reads."""

PURPOSES = frozenset({"handoff", "final"})
"""``handoff``: state passed to the next hospital; ``final``: the weights every participant
receives at the end of a job."""

KEY_BYTES = 32
SALT_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_FIELD_CHARS = 256
"""The longest job id, sender or recipient name a context accepts."""

# AES-GCM in ``cryptography`` takes at most 2**31 - 1 bytes, and the ciphertext carries the tag.
MAX_PLAINTEXT_BYTES = 2**31 - 1 - TAG_BYTES
"""The largest plaintext :func:`seal` accepts (just under 2 GiB)."""

_LABEL = b"medsplit/seal/v1"
_LENGTH_BYTES = 2
_PREFIX_BYTES = len(MAGIC) + 1 + _LENGTH_BYTES
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
        purpose: ``"handoff"`` (to the next hospital) or ``"final"`` (final weights).

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
        context, used as the AEAD associated data, in the HKDF info and as the blob header."""
        return _canonical(self._as_dict())

    def _as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}


def generate_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key, for an agent to create once and keep to itself."""
    return X25519PrivateKey.generate()


def private_key_to_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of a private key, for the agent to store locally (never to send)."""
    if not isinstance(key, X25519PrivateKey):
        raise TypeError(f"expected an X25519PrivateKey, got {type(key).__name__}")
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def private_key_from_bytes(raw: bytes) -> X25519PrivateKey:
    """A private key from the raw 32 bytes :func:`private_key_to_bytes` gave.

    Raises:
        SealError: ``raw`` is not 32 bytes.
    """
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise TypeError(f"expected the private key as bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) != KEY_BYTES:
        raise SealError(
            f"an X25519 private key has {KEY_BYTES} bytes, this one has {len(raw)}: "
            "is the key file complete, and is it this agent's key file?"
        )
    return X25519PrivateKey.from_private_bytes(raw)


def public_key_b64(key: X25519PrivateKey | X25519PublicKey) -> str:
    """The standard base64 of the raw 32-byte public key (of a private key's pair, if given
    a private key): what an agent sends at enrolment."""
    if isinstance(key, X25519PrivateKey):
        key = key.public_key()
    if not isinstance(key, X25519PublicKey):
        raise TypeError(f"expected an X25519 private or public key, got {type(key).__name__}")
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def public_key_from_b64(text: str) -> X25519PublicKey:
    """The public key whose standard base64 :func:`public_key_b64` gave.

    Raises:
        SealError: the text is not base64, does not decode to 32 bytes, or is a
            small-order point (such as all zeros) that would make every key predictable.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected the public key as base64 text, got {type(text).__name__}")
    if len(text) > 64:
        raise SealError(
            f"an X25519 public key is 44 characters of base64, this text has {len(text)}"
        )
    try:
        raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SealError(
            "the public key is not valid standard base64: check that it was copied whole"
        ) from None
    if len(raw) != KEY_BYTES:
        raise SealError(
            f"an X25519 public key has {KEY_BYTES} bytes, this base64 decodes to {len(raw)}"
        )
    key = X25519PublicKey.from_public_bytes(raw)
    try:
        X25519PrivateKey.generate().exchange(key)
    except ValueError:
        raise SealError(
            "not a usable X25519 public key (a small-order point such as all zeros)"
        ) from None
    return key


def seal(
    plaintext: bytes,
    *,
    sender: X25519PrivateKey,
    recipient: X25519PublicKey,
    context: SealContext,
) -> bytes:
    """Encrypt ``plaintext`` so that only ``recipient`` can read it, and can tell it came
    from ``sender`` for ``context``.

    Args:
        plaintext: the bytes to seal (bytes-like), up to :data:`MAX_PLAINTEXT_BYTES`.
        sender: the sealing agent's own private key.
        recipient: the recipient agent's public key, as the coordinator gave it.
        context: the job, round, parties and purpose this blob is for.

    Returns:
        The sealed blob (see the module docstring for its layout); it is
        ``len(plaintext) + 71`` bytes plus the length of the canonical context.

    Raises:
        SealError: the plaintext is too large, or the recipient's key is a small-order
            point.
    """
    _check_keys(sender, X25519PrivateKey, recipient, X25519PublicKey)
    _check_context(context)
    if not isinstance(plaintext, bytes | bytearray | memoryview):
        raise TypeError(f"expected the plaintext as bytes, got {type(plaintext).__name__}")
    size = memoryview(plaintext).nbytes
    if size > MAX_PLAINTEXT_BYTES:
        raise SealError(
            f"cannot seal {size} bytes in one blob, at most {MAX_PLAINTEXT_BYTES}: "
            "split the state into several blobs"
        )
    header = context.canonical_bytes()
    salt = os.urandom(SALT_BYTES)
    nonce = os.urandom(NONCE_BYTES)
    key = _derive_key(sender, recipient, sender.public_key(), recipient, salt, header)
    ciphertext = AESGCM(key).encrypt(nonce, plaintext, header)
    prefix = MAGIC + bytes([FORMAT_VERSION]) + len(header).to_bytes(_LENGTH_BYTES, "big")
    return b"".join((prefix, header, salt, nonce, ciphertext))


def unseal(
    blob: bytes,
    *,
    recipient: X25519PrivateKey,
    sender: X25519PublicKey,
    context: SealContext,
) -> bytes:
    """Decrypt a blob :func:`seal` made, checking it is from ``sender`` and for ``context``.

    Args:
        blob: the sealed bytes as received from the relay (bytes-like).
        recipient: this agent's own private key.
        sender: the public key of the hospital the blob should come from, as the
            coordinator gave it.
        context: what this agent expects the blob to be for, built from its own knowledge
            of the job (never from the blob).

    Returns:
        The plaintext.

    Raises:
        SealError: the bytes are not a sealed blob, have an unsupported format version, are
            truncated, were sealed for another context (replayed or misplaced: the message
            names the fields that differ), or fail authentication (altered, or not sealed
            with these keys).
    """
    _check_keys(recipient, X25519PrivateKey, sender, X25519PublicKey)
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
    if version != FORMAT_VERSION:
        raise SealError(
            f"sealed blob has format version {version}, this MedSplit reads version "
            f"{FORMAT_VERSION}: the sender and this agent run incompatible MedSplit releases"
        )
    header_size = int.from_bytes(view[len(MAGIC) + 1 : _PREFIX_BYTES], "big")
    body = _PREFIX_BYTES + header_size
    minimum = body + SALT_BYTES + NONCE_BYTES + TAG_BYTES
    if size < minimum:
        raise _truncated(size, minimum)
    expected = context.canonical_bytes()
    header = bytes(view[_PREFIX_BYTES:body])
    if header != expected:
        raise _mismatch(header, context)
    salt = bytes(view[body : body + SALT_BYTES])
    nonce = bytes(view[body + SALT_BYTES : body + SALT_BYTES + NONCE_BYTES])
    key = _derive_key(recipient, sender, sender, recipient.public_key(), salt, expected)
    try:
        return AESGCM(key).decrypt(nonce, view[body + SALT_BYTES + NONCE_BYTES :], expected)
    except InvalidTag:
        raise SealError(
            f"sealed {context.purpose} blob for round {context.round} of job "
            f"{_show(context.job)} failed authentication: either it was altered on the way "
            f"(in the relay or in transit), or it was not sealed by {_show(context.sender)} "
            "for this agent's key (wrong sender public key, or this agent's private key is "
            "not the one enrolled). Do not load it; ask the sender to hand off again."
        ) from None


def _derive_key(
    own: X25519PrivateKey,
    peer: X25519PublicKey,
    sender_public: X25519PublicKey,
    recipient_public: X25519PublicKey,
    salt: bytes,
    context: bytes,
) -> bytes:
    """The AES-256 key of one blob, from this agent's private key ``own`` and the other
    party's public key ``peer``; the info names both public keys, sender's first."""
    try:
        shared = own.exchange(peer)
    except ValueError:
        raise SealError(
            "the other party's public key is not usable (a small-order point such as all "
            "zeros): check the key the coordinator holds for that hospital"
        ) from None
    info = b"".join(
        (_LABEL, b"\x00", _raw_public(sender_public), _raw_public(recipient_public), context)
    )
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(shared)


def _raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


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


def _check_keys(own: object, own_type: type, peer: object, peer_type: type) -> None:
    if not isinstance(own, own_type):
        raise TypeError(f"expected an {own_type.__name__} for this agent, got {type(own).__name__}")
    if not isinstance(peer, peer_type):
        raise TypeError(
            f"expected an {peer_type.__name__} for the other hospital, got {type(peer).__name__}"
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
