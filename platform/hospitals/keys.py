"""Checking an agent's X25519 public key before the coordinator keeps it."""

from __future__ import annotations

import base64
import binascii

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

X25519_KEY_BYTES = 32


def parse_x25519_public_key(text: str) -> str:
    """The canonical base64 of an X25519 public key given as base64 (32 bytes).

    Besides the length, the key must give a usable shared secret: the small-order points
    (the all-zero key among them) would make every hand-off key predictable.

    Raises:
        ValueError: the text is not base64, not 32 bytes, or not a usable key.
    """
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("expected the key as base64 text of 32 bytes")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("not valid base64") from None
    if len(raw) != X25519_KEY_BYTES:
        raise ValueError(f"an X25519 public key has {X25519_KEY_BYTES} bytes, this one {len(raw)}")
    try:
        key = X25519PublicKey.from_public_bytes(raw)
        X25519PrivateKey.generate().exchange(key)
    except ValueError:
        raise ValueError("not a usable X25519 public key (a small-order point)") from None
    return base64.b64encode(raw).decode("ascii")
