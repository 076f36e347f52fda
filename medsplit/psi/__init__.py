"""Record alignment for vertical split learning: private set intersection (PSI).

Each party holds pseudonymous patient identifiers (:mod:`.identifiers`). The label party
runs one two-party PSI session with each other party as the client, learning the
intersection, while the other party learns only its set size (:mod:`.session`, messages
in :mod:`.messages`; ECDH by OpenMined's ``openmined-psi``). It then forms the K-way
intersection in a common order derived from the job's seed, refuses one below the job's
minimum, and hands it on with a digest the parties compare (:mod:`.alignment`). Batches
follow an order each party derives from the seed (:mod:`.batches`).

Imports no Django nor Celery, and no mode.
"""

from medsplit.psi.alignment import Alignment, align, common_order, order_key
from medsplit.psi.batches import epoch_batches, epoch_order
from medsplit.psi.errors import (
    DigestMismatch,
    IdentifierError,
    IntersectionTooSmall,
    PsiError,
    PsiMessageError,
)
from medsplit.psi.identifiers import (
    MAX_IDENTIFIER_LENGTH,
    MAX_IDENTIFIERS,
    check_identifiers,
    identifiers_from_csv,
    identifiers_from_files,
    load_identifiers,
)
from medsplit.psi.messages import PsiRequest, PsiResponse, PsiSetup
from medsplit.psi.session import PsiClient, PsiServer, ServerReply

__all__ = [
    "MAX_IDENTIFIERS",
    "MAX_IDENTIFIER_LENGTH",
    "Alignment",
    "DigestMismatch",
    "IdentifierError",
    "IntersectionTooSmall",
    "PsiClient",
    "PsiError",
    "PsiMessageError",
    "PsiRequest",
    "PsiResponse",
    "PsiServer",
    "PsiSetup",
    "ServerReply",
    "align",
    "check_identifiers",
    "common_order",
    "epoch_batches",
    "epoch_order",
    "identifiers_from_csv",
    "identifiers_from_files",
    "load_identifiers",
    "order_key",
]
