"""Statements a hospital signs with its identity key, for anyone holding its public key.

A statement is a small JSON object (what a hospital witnessed of the audit chain, say),
written canonically and signed with ML-DSA-65 under a context naming its purpose, so that
a signature over one kind of statement can never pass as another kind, or as a sealed
blob's or a recipient key's (:mod:`medsplit.protocol.keys`, :mod:`medsplit.protocol.sealing`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey

from medsplit.errors import SealError

_PURPOSE = re.compile(r"[a-z][a-z0-9-]{0,40}")
MAX_STATEMENT_BYTES = 8 * 1024


def canonical(statement: Mapping[str, Any]) -> str:
    """The statement as the text that is signed: sorted keys, no spaces, ASCII."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sign_statement(
    identity: MLDSA65PrivateKey, purpose: str, statement: Mapping[str, Any]
) -> tuple[str, str]:
    """The statement's canonical text and its signature (base64) for ``purpose``."""
    text = canonical(statement)
    if len(text) > MAX_STATEMENT_BYTES:
        raise SealError(f"a signed statement holds at most {MAX_STATEMENT_BYTES} bytes")
    signature = identity.sign(text.encode("ascii"), _context(purpose))
    return text, base64.b64encode(signature).decode("ascii")


def verify_statement(
    public: MLDSA65PublicKey, purpose: str, text: str, signature: str
) -> dict[str, Any]:
    """The statement ``text`` if ``signature`` is its signer's for ``purpose``.

    Raises:
        SealError: not a statement, not base64, or not signed by ``public`` for ``purpose``.
    """
    if not isinstance(text, str) or len(text) > MAX_STATEMENT_BYTES:
        raise SealError(f"a signed statement is text of at most {MAX_STATEMENT_BYTES} bytes")
    try:
        raw = base64.b64decode(signature, validate=True)
        public.verify(raw, text.encode("ascii"), _context(purpose))
        statement = json.loads(text)
    except (binascii.Error, ValueError, TypeError, UnicodeEncodeError) as e:
        raise SealError(f"the statement or its signature is malformed: {e}") from None
    except InvalidSignature:
        raise SealError(
            f"the {purpose} statement is not signed by the hospital's identity key"
        ) from None
    if not isinstance(statement, dict) or canonical(statement) != text:
        raise SealError("the signed statement is not a canonical JSON object")
    return statement


def _context(purpose: str) -> bytes:
    if not _PURPOSE.fullmatch(purpose):
        raise ValueError(f"not a statement purpose: {purpose!r}")
    return f"medsplit/{purpose}/v1".encode("ascii")
