"""The coordinator's export signing key: the identity the worker seals a job's server
segment with, so that the receiving agent can tell the part came from the coordinator's
side (which owns the server segment) and was not altered on the way.

It is derived from ``SECRET_KEY`` (HKDF-SHA256), which the web process and the workers
share, so every worker signs with the same key and nothing new has to be deployed; the
agents learn its public half from the export's detail (over the coordinator's TLS).
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from medsplit.protocol.keys import IDENTITY_SEED_BYTES, identity_key_from_bytes

_INFO = b"medsplit/export-signing/v1"


def export_signing_key() -> MLDSA65PrivateKey:
    """The ML-DSA-65 key the workers sign sealed server segments with."""
    seed = HKDF(
        algorithm=hashes.SHA256(), length=IDENTITY_SEED_BYTES, salt=None, info=_INFO
    ).derive(settings.SECRET_KEY.encode())
    return identity_key_from_bytes(seed)
