"""The keys of sealed hand-offs: each hospital's identity key, its per-job recipient keys,
and the fingerprints people compare out of band.

* An **identity key** is an ML-DSA-65 signing key (FIPS 204) an agent makes once and keeps.
  It signs every blob the hospital seals and every recipient key it publishes, so a
  recipient knows which hospital sealed a blob. Its public key is 1,952 bytes; the agent
  keeps the 32-byte seed.
* A **recipient key** is an HPKE key pair of the KEM ``MLKEM768_X25519`` (ML-KEM-768 and
  X25519 together: a blob stays closed unless *both* are broken, so hand-offs recorded
  today stay closed to a future quantum computer). An agent makes one per job, publishes
  its public half signed with its identity key (:class:`SignedRecipientKey`) and deletes
  the private half once the job has ended, so a key stolen later opens no recorded blob.
  The public key is the ML-KEM-768 public key (1,184 bytes) followed by the X25519 one
  (32 bytes): 1,216 bytes; the private key the ML-KEM seed (64) and the X25519 key (32).
* A **fingerprint** is the SHA-256 of an identity public key, 64 hex digits, shown in 16
  groups of four (:func:`format_fingerprint`) for people to read aloud and compare.

Every primitive comes from ``cryptography``; nothing here is cryptography by hand.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from medsplit.errors import SealError

__all__ = [
    "IDENTITY_PUBLIC_BYTES",
    "IDENTITY_SEED_BYTES",
    "RECIPIENT_PRIVATE_BYTES",
    "RECIPIENT_PUBLIC_BYTES",
    "SIGNATURE_BYTES",
    "RecipientKey",
    "RecipientPublicKey",
    "SignedRecipientKey",
    "fingerprint",
    "format_fingerprint",
    "generate_identity_key",
    "identity_key_from_bytes",
    "identity_key_to_bytes",
    "identity_public_b64",
    "identity_public_from_b64",
]

IDENTITY_SEED_BYTES = 32
IDENTITY_PUBLIC_BYTES = 1952
SIGNATURE_BYTES = 3309
"""An ML-DSA-65 signature's length."""
_MLKEM_PUBLIC_BYTES = 1184
_MLKEM_SEED_BYTES = 64
_X25519_BYTES = 32
RECIPIENT_PUBLIC_BYTES = _MLKEM_PUBLIC_BYTES + _X25519_BYTES
RECIPIENT_PRIVATE_BYTES = _MLKEM_SEED_BYTES + _X25519_BYTES

# ML-DSA's context string separates what one identity key signs: a recipient key can
# never pass for a blob's signature, nor the other way round.
RECIPIENT_KEY_SIGNING_CONTEXT = b"medsplit/recipient-key/v1"
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


# -- identity keys ----------------------------------------------------------------------


def generate_identity_key() -> MLDSA65PrivateKey:
    """A fresh ML-DSA-65 identity key, for an agent to make once and keep to itself."""
    return MLDSA65PrivateKey.generate()


def identity_key_to_bytes(key: MLDSA65PrivateKey) -> bytes:
    """The 32-byte seed of an identity key, for the agent to store locally (never to send)."""
    if not isinstance(key, MLDSA65PrivateKey):
        raise TypeError(f"expected an MLDSA65PrivateKey, got {type(key).__name__}")
    return key.private_bytes_raw()


def identity_key_from_bytes(raw: bytes) -> MLDSA65PrivateKey:
    """The identity key whose seed :func:`identity_key_to_bytes` gave.

    Raises:
        SealError: ``raw`` is not 32 bytes.
    """
    raw = _bytes(raw, "the identity key")
    if len(raw) != IDENTITY_SEED_BYTES:
        raise SealError(
            f"an ML-DSA-65 identity key is a {IDENTITY_SEED_BYTES}-byte seed, this one has "
            f"{len(raw)} bytes: is the key file complete, and is it this agent's identity key?"
        )
    return MLDSA65PrivateKey.from_seed_bytes(raw)


def identity_public_b64(key: MLDSA65PrivateKey | MLDSA65PublicKey) -> str:
    """The standard base64 of the raw 1,952-byte public key (of a private key's pair, if
    given a private key): what an agent sends at enrolment."""
    return base64.b64encode(_identity_public(key).public_bytes_raw()).decode("ascii")


def identity_public_from_b64(text: str) -> MLDSA65PublicKey:
    """The identity public key whose standard base64 :func:`identity_public_b64` gave.

    Raises:
        SealError: the text is not base64 or not an ML-DSA-65 public key.
    """
    raw = _from_b64(text, "identity public key", IDENTITY_PUBLIC_BYTES)
    try:
        return MLDSA65PublicKey.from_public_bytes(raw)
    except ValueError:
        raise SealError("not a usable ML-DSA-65 public key") from None


def fingerprint(key: MLDSA65PrivateKey | MLDSA65PublicKey) -> str:
    """The SHA-256 of the raw identity public key, as 64 lower-case hex digits."""
    return hashlib.sha256(_identity_public(key).public_bytes_raw()).hexdigest()


def format_fingerprint(hex_digits: str) -> str:
    """A fingerprint in 16 groups of four hex digits (``3f2a 91c0 ...``), the form the
    dashboard and ``medsplit-agent status`` both show, for comparison out of band.

    Raises:
        SealError: the text is not 64 hex digits (grouped or not).
    """
    digits = "".join(hex_digits.split()).lower() if isinstance(hex_digits, str) else ""
    if not _FINGERPRINT.fullmatch(digits):
        raise SealError(f"a fingerprint is 64 hex digits, got {_show(hex_digits)}")
    return " ".join(digits[i : i + 4] for i in range(0, 64, 4))


# -- recipient keys ----------------------------------------------------------------------


@dataclass(frozen=True)
class RecipientPublicKey:
    """The public half of a per-job recipient key: ML-KEM-768 then X25519, 1,216 bytes.

    Build it with :meth:`from_bytes` or :meth:`from_b64`, which check both parts.
    """

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes):
            raise TypeError(f"expected the key as bytes, got {type(self.raw).__name__}")
        if len(self.raw) != RECIPIENT_PUBLIC_BYTES:
            raise SealError(
                f"a recipient public key has {RECIPIENT_PUBLIC_BYTES} bytes (ML-KEM-768 and "
                f"X25519), this one has {len(self.raw)}"
            )
        self._parts()  # refuses unusable parts at once

    @classmethod
    def from_bytes(cls, raw: bytes) -> RecipientPublicKey:
        return cls(_bytes(raw, "the recipient public key"))

    @classmethod
    def from_b64(cls, text: str) -> RecipientPublicKey:
        """Raises: SealError: not base64, not 1,216 bytes, or an unusable part."""
        return cls(_from_b64(text, "recipient public key", RECIPIENT_PUBLIC_BYTES))

    def b64(self) -> str:
        return base64.b64encode(self.raw).decode("ascii")

    def sha256(self) -> str:
        """The SHA-256 of the raw key (hex): what a blob names as the key it was sealed to."""
        return hashlib.sha256(self.raw).hexdigest()

    def hpke(self) -> hpke.MLKEM768X25519PublicKey:
        """The key as ``cryptography``'s HPKE takes it."""
        return hpke.MLKEM768X25519PublicKey(*self._parts())

    def _parts(self) -> tuple[MLKEM768PublicKey, X25519PublicKey]:
        try:
            mlkem = MLKEM768PublicKey.from_public_bytes(self.raw[:_MLKEM_PUBLIC_BYTES])
        except ValueError:
            raise SealError("the recipient key's ML-KEM-768 part is not a usable key") from None
        x25519 = X25519PublicKey.from_public_bytes(self.raw[_MLKEM_PUBLIC_BYTES:])
        try:  # a small-order point (all zeros, say) would make the X25519 part predictable
            X25519PrivateKey.generate().exchange(x25519)
        except ValueError:
            raise SealError(
                "the recipient key's X25519 part is not usable (a small-order point such as "
                "all zeros)"
            ) from None
        return mlkem, x25519


@dataclass(frozen=True)
class RecipientKey:
    """A per-job recipient key pair (private): made by the agent when it first takes part
    in a job, kept in that job's folder, deleted once the job has ended."""

    mlkem: MLKEM768PrivateKey
    x25519: X25519PrivateKey

    @classmethod
    def generate(cls) -> RecipientKey:
        return cls(MLKEM768PrivateKey.generate(), X25519PrivateKey.generate())

    @classmethod
    def from_bytes(cls, raw: bytes) -> RecipientKey:
        """The key whose 96 bytes :meth:`to_bytes` gave.

        Raises:
            SealError: ``raw`` is not 96 bytes.
        """
        raw = _bytes(raw, "the recipient key")
        if len(raw) != RECIPIENT_PRIVATE_BYTES:
            raise SealError(
                f"a recipient private key has {RECIPIENT_PRIVATE_BYTES} bytes (the ML-KEM-768 "
                f"seed and the X25519 key), this one has {len(raw)}: is the key file complete?"
            )
        return cls(
            MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED_BYTES]),
            X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED_BYTES:]),
        )

    def to_bytes(self) -> bytes:
        """The ML-KEM seed then the X25519 key, 96 bytes, for the agent's file only."""
        return self.mlkem.private_bytes_raw() + self.x25519.private_bytes_raw()

    def public(self) -> RecipientPublicKey:
        return RecipientPublicKey(
            self.mlkem.public_key().public_bytes_raw() + self.x25519.public_key().public_bytes_raw()
        )

    def hpke(self) -> hpke.MLKEM768X25519PrivateKey:
        """The key as ``cryptography``'s HPKE takes it."""
        return hpke.MLKEM768X25519PrivateKey(self.mlkem, self.x25519)


@dataclass(frozen=True)
class SignedRecipientKey:
    """A recipient key as published: for ``job``, of ``hospital``, signed by that
    hospital's identity key over the job, the hospital and the key bytes.

    The job and hospital are what the verifier expects (the assignment's), never read from
    the coordinator's copy: a key signed for another job or hospital does not verify.
    """

    job: str
    hospital: str
    key: RecipientPublicKey
    signature: bytes

    @classmethod
    def sign(
        cls, *, job: str, hospital: str, key: RecipientPublicKey, identity: MLDSA65PrivateKey
    ) -> SignedRecipientKey:
        if not isinstance(identity, MLDSA65PrivateKey):
            raise TypeError(f"expected an MLDSA65PrivateKey, got {type(identity).__name__}")
        message = _recipient_key_message(job, hospital, key)
        return cls(job, hospital, key, identity.sign(message, RECIPIENT_KEY_SIGNING_CONTEXT))

    @classmethod
    def from_json(cls, *, job: str, hospital: str, data: object) -> SignedRecipientKey:
        """The published ``{"key": ..., "signature": ...}`` (base64) of ``hospital`` for
        ``job``.

        Raises:
            SealError: nothing was published, it is not signed, or a field is malformed.
        """
        if not isinstance(data, dict) or not data.get("key"):
            raise SealError(
                f"{_show(hospital)} has published no recipient key for {_show(job)} yet"
            )
        if not data.get("signature"):
            raise SealError(
                f"the recipient key of {_show(hospital)} for {_show(job)} is not signed: "
                "refusing to seal to a key its owner did not vouch for"
            )
        key = RecipientPublicKey.from_b64(data["key"])
        signature = _from_b64(data["signature"], "recipient key signature", SIGNATURE_BYTES)
        return cls(job, hospital, key, signature)

    def to_json(self) -> dict[str, str]:
        return {"key": self.key.b64(), "signature": base64.b64encode(self.signature).decode()}

    def verify(self, identity: MLDSA65PublicKey) -> RecipientPublicKey:
        """The key, once its signature verifies under ``identity`` (the owner's pinned key).

        Raises:
            SealError: unsigned, or not signed by ``identity`` for this job and hospital.
        """
        if not isinstance(identity, MLDSA65PublicKey):
            raise TypeError(f"expected an MLDSA65PublicKey, got {type(identity).__name__}")
        if not self.signature:
            raise SealError(
                f"the recipient key of {_show(self.hospital)} for {_show(self.job)} is not "
                "signed: refusing to seal to a key its owner did not vouch for"
            )
        message = _recipient_key_message(self.job, self.hospital, self.key)
        try:
            identity.verify(self.signature, message, RECIPIENT_KEY_SIGNING_CONTEXT)
        except InvalidSignature:
            raise SealError(
                f"the recipient key given for {_show(self.hospital)} in {_show(self.job)} "
                f"(sha256 {self.key.sha256()[:16]}...) is not signed by its pinned identity "
                f"key (fingerprint {format_fingerprint(fingerprint(identity))}): the "
                "coordinator swapped it, or it was signed for another job or hospital. "
                "Refusing to seal to it."
            ) from None
        return self.key


# -- helpers -----------------------------------------------------------------------------


def _recipient_key_message(job: str, hospital: str, key: RecipientPublicKey) -> bytes:
    for name, value in (("job", job), ("hospital", hospital)):
        if not isinstance(value, str) or not value:
            raise SealError(f"a recipient key's {name} must be a non-empty string")
    if not isinstance(key, RecipientPublicKey):
        raise TypeError(f"expected a RecipientPublicKey, got {type(key).__name__}")
    # JSON with ASCII escapes holds no NUL, so the key bytes after it cannot be confused.
    head = json.dumps({"hospital": hospital, "job": job}, sort_keys=True, ensure_ascii=True)
    return head.encode("ascii") + b"\x00" + key.raw


def _identity_public(key: object) -> MLDSA65PublicKey:
    if isinstance(key, MLDSA65PrivateKey):
        return key.public_key()
    if not isinstance(key, MLDSA65PublicKey):
        raise TypeError(f"expected an ML-DSA-65 private or public key, got {type(key).__name__}")
    return key


def _bytes(raw: object, what: str) -> bytes:
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise TypeError(f"expected {what} as bytes, got {type(raw).__name__}")
    return bytes(raw)


def _from_b64(text: object, what: str, size: int) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected the {what} as base64 text, got {type(text).__name__}")
    longest = 4 * ((size + 2) // 3)
    if len(text) > longest + 2:  # before decoding: a huge text costs nothing to refuse
        raise SealError(f"the {what} is {longest} characters of base64, this text has {len(text)}")
    try:
        raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SealError(
            f"the {what} is not valid standard base64: check that it was copied whole"
        ) from None
    if len(raw) != size:
        raise SealError(f"the {what} has {size} bytes, this base64 decodes to {len(raw)}")
    return raw


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
