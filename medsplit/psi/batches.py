"""The order of an epoch's records, which every party derives alone from the job's seed.

A pure function of the alignment (its digest), the seed and the epoch: every party
computes the same permutation of the aligned records, so no index list crosses. Each
position ``i`` of the alignment is ranked by HMAC-SHA256 under a key derived from the
seed, the epoch and the alignment's digest; ties cannot occur in practice, and are broken
by the position.
"""

from __future__ import annotations

import hashlib
import hmac

from medsplit.psi.alignment import Alignment, seed_bytes
from medsplit.psi.errors import PsiError

__all__ = ["epoch_batches", "epoch_order"]


def epoch_order(alignment: Alignment, *, seed: int, epoch: int) -> list[int]:
    """The positions of ``alignment`` in the order epoch ``epoch`` visits them."""
    if not isinstance(epoch, int) or not 0 <= epoch < 2**32:
        raise PsiError(f"epoch must be an integer in 0..2^32-1, got {epoch!r}")
    key = hashlib.sha256(
        b"medsplit/psi/epoch/v1\0"
        + seed_bytes(seed)
        + epoch.to_bytes(4, "big")
        + bytes.fromhex(alignment.digest())
    ).digest()
    ranks = [hmac.digest(key, i.to_bytes(4, "big"), "sha256") for i in range(len(alignment))]
    return sorted(range(len(alignment)), key=lambda i: (ranks[i], i))


def epoch_batches(
    alignment: Alignment, batch_size: int, *, seed: int, epoch: int, drop_last: bool = False
) -> list[list[int]]:
    """:func:`epoch_order` cut into batches of ``batch_size`` positions (the last one
    shorter, or dropped with ``drop_last``)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise PsiError(f"batch size must be a positive integer, got {batch_size!r}")
    order = epoch_order(alignment, seed=seed, epoch=epoch)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches
