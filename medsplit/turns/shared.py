"""Several turns training one shared server segment in one task: SplitFed's SFLV2.

One :class:`~medsplit.turns.server.TurnServer` per hospital, each in its own thread with
its own streams, handshake, validation and record, all on the same server
:class:`~medsplit.protocol.party.Party`. :class:`SharedSegmentGate` makes the result
independent of timing: the steps run one at a time in a fixed order (the mode's
:meth:`~medsplit.modes.SplitMode.step_order`, drawn from the job's seed), every turn
loads the group's starting state before any step runs, and validation waits until every
training step ran. :class:`SharedStart` is each turn's store: the group's start only, so
a hospital that comes back mid-round cannot take the segment back for itself alone; its
turn fails, and with it the group (the caller decides, by the job's failure policy).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from medsplit.turns.checkpoints import BASE
from medsplit.turns.server import TurnFailed
from medsplit.turns.stores import StateStore, StoreError

__all__ = ["SharedSegmentGate", "SharedStart"]


class SharedSegmentGate:
    """The order of a group's steps on one shared segment (a
    :class:`~medsplit.turns.server.StepGate`).

    Args:
        order: the positions of the group's turns in the order their steps are applied
            (each position as often as its turn has training steps).
        wait: longest wait between two looks at whether the group failed, in seconds.
    """

    def __init__(self, order: Sequence[int], *, wait: float = 1.0) -> None:
        self.order = list(order)
        self.positions = frozenset(self.order)
        self.wait = wait
        self._cond = threading.Condition()
        self._eval = threading.Lock()
        self._cursor = 0
        self._holder: int | None = None
        self._restored: set[int] = set()
        self._done: Counter[int] = Counter()
        self._failed: str | None = None
        #: (position, step) in the order the steps were applied.
        self.served: list[tuple[int, int]] = []

    @property
    def trained(self) -> bool:
        """Whether every training step of the group ran."""
        return self._cursor == len(self.order)

    def fail(self, reason: str) -> None:
        """The group cannot go on: every turn waiting here fails with ``reason``."""
        with self._cond:
            if self._failed is None:
                self._failed = reason
            self._cond.notify_all()

    def _check(self) -> None:
        if self._failed is not None:
            raise TurnFailed(f"the round's shared server segment stopped: {self._failed}")

    @contextmanager
    def restoring(self, position: int, start: int) -> Iterator[None]:
        with self._cond:
            self._check()
            if self._cursor or self._holder is not None or start != 0:
                raise TurnFailed(
                    f"the turn at position {position} would resume at step {start} after "
                    f"{self._cursor} step(s) of the round ran on the shared server segment, "
                    "which cannot go back for one hospital: the round starts again"
                )
            yield
            self._restored.add(position)
            self._cond.notify_all()

    def acquire(self, position: int, step: int) -> None:
        with self._cond:
            if position not in self.positions:
                raise TurnFailed(f"position {position} has no steps in this round's order")
            expected = self._done[position]
            if step != expected:
                raise TurnFailed(
                    f"position {position} sent step {step} where its step {expected} is next"
                )
            while True:
                self._check()
                ready = self._restored >= self.positions and self._holder is None
                if ready and not self.trained and self.order[self._cursor] == position:
                    break
                self._cond.wait(self.wait)
            self._holder = position

    def release(self, position: int, step: int) -> None:
        with self._cond:
            if self._holder != position:
                raise TurnFailed(f"position {position} released a step it does not hold")
            self._holder = None
            self._cursor += 1
            self._done[position] += 1
            self.served.append((position, step))
            self._cond.notify_all()

    def wait_trained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every training step; whether they ran.

        Raises:
            TurnFailed: the group failed.
        """
        with self._cond:
            self._cond.wait_for(lambda: self.trained or self._failed is not None, timeout)
            self._check()
            return self.trained

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        with self._cond:
            while not self.trained:
                self._check()
                self._cond.wait(self.wait)
            self._check()
        with self._eval:
            yield


class SharedStart(StateStore):
    """A turn's store in a group on a shared segment: the group's start, nothing saved
    (checkpoints of one turn would hold the others' steps too)."""

    def __init__(self, start: bytes) -> None:
        self._start = start

    def steps(self) -> list[int]:
        return [BASE]

    def load(self, step: int) -> bytes:
        if step != BASE:
            raise StoreError(f"a shared segment keeps the round's start only, not step {step}")
        return self._start

    def save(self, step: int, data: bytes) -> None:
        return None  # see the class docstring
