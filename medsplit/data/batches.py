"""Deterministic batch orders, so split and unsplit training see the same batches."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from medsplit.data.shards import DataSplit
from medsplit.errors import ConfigError


def batch_order(
    n: int, *, batch_size: int, seed: int, epoch: int, drop_last: bool = False
) -> list[torch.Tensor]:
    """The indices of each batch of one epoch, in order.

    The permutation depends only on ``(seed, epoch)``, never on the global RNG, so any
    party that knows both draws the same batches.

    Args:
        n: number of items.
        batch_size: items per batch.
        seed: run seed.
        epoch: epoch number; each epoch gets its own permutation.
        drop_last: drop a final batch smaller than ``batch_size``.

    Returns:
        int64 index tensors covering a permutation of ``range(n)`` (minus the short tail
        when ``drop_last``); empty when ``drop_last`` and ``n < batch_size``.

    Raises:
        ConfigError: ``n``, ``batch_size``, ``seed`` or ``epoch`` is out of range.
    """
    for name, value, minimum in (
        ("n", n, 1),
        ("batch_size", batch_size, 1),
        ("seed", seed, 0),
        ("epoch", epoch, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    generator = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    batches = list(torch.randperm(n, generator=generator).split(batch_size))
    if drop_last and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def _epoch_seed(seed: int, epoch: int) -> int:
    # A hash rather than arithmetic such as seed * K + epoch, whose pairs collide; sha256
    # is the same on every platform and Python process (unlike hash()).
    digest = hashlib.sha256(f"medsplit-batches:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: a valid torch seed


def iter_batches(
    split: DataSplit, *, batch_size: int, seed: int, epoch: int, drop_last: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images, labels)`` batches of ``split`` in :func:`batch_order`'s order.

    Raises:
        ConfigError: as :func:`batch_order`, at the call rather than at the first batch.
    """
    order = batch_order(
        len(split), batch_size=batch_size, seed=seed, epoch=epoch, drop_last=drop_last
    )
    return ((split.images[idx], split.labels[idx]) for idx in order)
