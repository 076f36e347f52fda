"""Agents' X25519 public keys are checked before they are kept."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from hospitals.keys import parse_x25519_public_key


def test_a_real_key_is_kept_in_canonical_base64() -> None:
    raw = X25519PrivateKey.generate().public_key().public_bytes_raw()
    assert parse_x25519_public_key(base64.b64encode(raw).decode()) == base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "32 bytes"),
        ("not base64!", "base64"),
        (base64.b64encode(b"\x01" * 31).decode(), "32 bytes"),
        (base64.b64encode(b"\x01" * 33).decode(), "32 bytes"),
        (base64.b64encode(bytes(32)).decode(), "small-order"),  # the all-zero point
        (base64.b64encode(b"\x01" + bytes(31)).decode(), "small-order"),  # order 1
        ("é" * 10, "base64"),
        ("A" * 100, "32 bytes"),
    ],
)
def test_unusable_keys_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_x25519_public_key(text)
