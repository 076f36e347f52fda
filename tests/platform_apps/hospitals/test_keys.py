"""Agents' ML-DSA-65 identity keys are checked before they are kept, with their fingerprint."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from hospitals.keys import parse_identity_key
from medsplit.protocol.keys import generate_identity_key


def test_a_real_key_is_kept_in_canonical_base64_with_its_fingerprint() -> None:
    raw = generate_identity_key().public_key().public_bytes_raw()
    parsed = parse_identity_key(base64.b64encode(raw).decode())
    assert parsed.text == base64.b64encode(raw).decode()
    assert parsed.fingerprint == hashlib.sha256(raw).hexdigest()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "1952 bytes"),
        ("not base64!", "base64"),
        (base64.b64encode(b"\x01" * 1951).decode(), "1952 bytes"),
        # The X25519 key an agent of an earlier release sends; named, since a random key
        # as its id would differ between the suite's two processes (xdist refuses that).
        pytest.param(
            base64.b64encode(X25519PrivateKey.generate().public_key().public_bytes_raw()).decode(),
            "1952 bytes",
            id="x25519-key-1952 bytes",
        ),
        ("é" * 10, "base64"),
        ("A" * 5000, "2604 characters"),
        (None, "base64 text"),
    ],
)
def test_unusable_keys_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_identity_key(text)
