"""Long random secrets (enrolment codes, agent tokens) and how they are stored.

A secret reads ``<prefix>_<key id>_<random part>``. The key id finds the row; only the
SHA-256 of the random part is stored, and it is compared in constant time. The random
part has 256 bits, so a fast hash is enough: there is nothing to brute-force.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

_KEY_ID_BYTES = 6
_SECRET_BYTES = 32


@dataclass(frozen=True)
class IssuedSecret:
    """A freshly made secret: show ``plaintext`` once, store ``key_id`` and ``digest``."""

    key_id: str
    plaintext: str
    digest: str


def issue(prefix: str) -> IssuedSecret:
    """A new secret with ``prefix`` (``msc`` for codes, ``msa`` for agent tokens)."""
    key_id = secrets.token_hex(_KEY_ID_BYTES)
    random_part = secrets.token_urlsafe(_SECRET_BYTES)
    return IssuedSecret(key_id, f"{prefix}_{key_id}_{random_part}", digest_of(random_part))


def digest_of(random_part: str) -> str:
    return hashlib.sha256(random_part.encode()).hexdigest()


def split(plaintext: str, prefix: str) -> tuple[str, str] | None:
    """``(key_id, random_part)`` of a well-formed secret with ``prefix``, else ``None``."""
    if not isinstance(plaintext, str) or len(plaintext) > 256:
        return None
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != prefix or len(parts[1]) != 2 * _KEY_ID_BYTES:
        return None
    return parts[1], parts[2]


def matches(random_part: str, digest: str) -> bool:
    """Whether ``random_part`` hashes to ``digest``, in constant time."""
    return hmac.compare_digest(digest_of(random_part), digest)
