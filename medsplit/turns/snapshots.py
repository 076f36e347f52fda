"""A hospital's snapshots of its own segments during a turn, to roll back to after a
server (or the hospital itself) restarts.

A snapshot "before step s" is the hospital's whole training state when it has applied
every step before ``s``. The snapshot before step 0 (the hand-off the turn started from)
is always kept, so a turn can always start over. Where they live is a
:class:`~medsplit.turns.stores.StateStore`.
"""

from __future__ import annotations

from medsplit.turns.stores import StateStore, StoreError


class MemorySnapshots(StateStore):
    """Snapshots in memory: step 0 and the last ``keep`` others."""

    def __init__(self, *, keep: int = 2) -> None:
        self._held: dict[int, bytes] = {}
        self.keep = keep

    def steps(self) -> list[int]:
        return sorted(self._held)

    def load(self, step: int) -> bytes:
        try:
            return self._held[step]
        except KeyError:
            raise StoreError(f"no snapshot before step {step}") from None

    def save(self, step: int, data: bytes) -> None:
        self._held[step] = bytes(data)
        others = sorted(s for s in self._held if s != 0)
        for old in others[: -self.keep]:
            del self._held[old]
