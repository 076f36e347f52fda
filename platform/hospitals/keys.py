"""Checking an agent's identity key (ML-DSA-65) before the coordinator keeps it."""

from __future__ import annotations

from dataclasses import dataclass

from medsplit.errors import SealError
from medsplit.protocol.keys import fingerprint, identity_public_b64, identity_public_from_b64


@dataclass(frozen=True)
class IdentityKey:
    """An identity public key in canonical base64, with its fingerprint (SHA-256, hex)."""

    text: str
    fingerprint: str


def parse_identity_key(text: object) -> IdentityKey:
    """The canonical form and fingerprint of an ML-DSA-65 public key given as base64
    (1,952 bytes).

    Raises:
        ValueError: the text is not base64 or not an ML-DSA-65 public key.
    """
    if not isinstance(text, str):
        raise ValueError("expected the identity key as base64 text")
    try:
        key = identity_public_from_b64(text)
    except SealError as e:
        raise ValueError(str(e)) from None
    return IdentityKey(text=identity_public_b64(key), fingerprint=fingerprint(key))
