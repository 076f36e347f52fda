"""The server's checkpoints during a turn, and when either side saves its state.

A checkpoint is the server party's whole training state (weights, optimizer state,
schedule), named by the last step it applied; ``-1`` (:data:`BASE`) is the turn's
starting point (where the previous turn left the server, or the initial weights). Where
they live is a :class:`~medsplit.turns.stores.StateStore`.
"""

from __future__ import annotations

from dataclasses import dataclass

from medsplit.turns.stores import StateStore, StoreError

BASE = -1


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a side saves its state: before every ``every``-th step, and once training
    ends (the server also when paused, and before a new handshake mid-turn).

    The server saves after answering step ``s - 1`` when :meth:`due` says so for ``s``;
    the hospital, which has that answer then, snapshots "before ``s``" at the same ``s``,
    so it holds a snapshot for every checkpoint but possibly the newest (the server's
    store keeps two for that reason). The server tells the hospital ``every`` in
    ``resume``.
    """

    every: int = 50

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.every}")

    def due(self, next_step: int, *, train_steps: int | None = None) -> bool:
        """Whether the state before ``next_step`` is saved (``train_steps``: the last)."""
        return next_step % self.every == 0 or next_step == train_steps


class MemoryCheckpointStore(StateStore):
    """Checkpoints in a dict: for simulations and tests. Keeps :data:`BASE` and the
    last ``keep``."""

    def __init__(self, base: bytes, *, keep: int = 2) -> None:
        self._base = base
        self._saved: dict[int, bytes] = {}
        self.keep = keep
        self.saves = 0

    def steps(self) -> list[int]:
        return [BASE, *sorted(self._saved)]

    def load(self, step: int) -> bytes:
        if step == BASE:
            return self._base
        try:
            return self._saved[step]
        except KeyError:
            raise StoreError(f"no checkpoint after step {step}") from None

    def save(self, step: int, data: bytes) -> None:
        self._saved[step] = bytes(data)
        self.saves += 1
        for old in sorted(self._saved)[: -self.keep]:
            del self._saved[old]
