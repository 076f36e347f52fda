"""The states of each side of a turn and the one table of transitions between them.

Each side (:class:`~medsplit.turns.server.TurnServer`,
:class:`~medsplit.turns.client.TurnClient`) keeps its state in a :class:`TurnState`,
which allows exactly the pairs of its side's table (:data:`SERVER_TRANSITIONS`,
:data:`CLIENT_TRANSITIONS`) and raises :class:`TurnStateError` on any other: a bug in a
side, never something a frame can cause (frames that do not fit the state are dropped
or refused before a transition is asked for).

The server::

    starting ──▶ handshake ──▶ training ◀──▶ mid_step     (U-shaped: the step's first
                   ▲   │        │  ▲                        exchange answered)
                   │   │        ▼  │hello
                   │   │      validating ──▶ completed
                   └───┴── hello (from training, mid_step, validating)
    handshake / training / validating ──▶ paused | stopped   (the coordinator's word)
    any state but the ends ──▶ failed

The hospital::

    starting ──▶ handshake ──▶ running ──▶ completed | paused | stopped
                   ▲              │  ──▶ interrupted (asked to stop, no step in flight)
                   └── sync ──────┘
    starting / handshake ──▶ interrupted; any state but the ends ──▶ failed
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Generic, TypeVar

from medsplit.errors import MedSplitError


class TurnStateError(MedSplitError):
    """A side of a turn asked for a transition its table does not hold (a bug)."""


class ServerState(StrEnum):
    STARTING = "starting"  # nothing sent yet (streams may be reset)
    HANDSHAKE = "handshake"  # a sync sent, waiting for the hospital's rejoin
    TRAINING = "training"  # at a step boundary of training
    MID_STEP = "mid_step"  # a step's first exchange answered, its second awaited
    VALIDATING = "validating"  # training over (checkpointed), validation steps
    COMPLETED = "completed"
    PAUSED = "paused"
    STOPPED = "stopped"
    FAILED = "failed"


class ClientState(StrEnum):
    STARTING = "starting"  # the hello not yet sent
    HANDSHAKE = "handshake"  # waiting for the server's sync, then its resume
    RUNNING = "running"  # restored at the server's step; stepping
    COMPLETED = "completed"
    PAUSED = "paused"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"  # this side was asked to stop
    FAILED = "failed"


_S = ServerState
_ENDS_S = {_S.PAUSED, _S.STOPPED, _S.FAILED}

#: Every allowed transition of the server's side, by the state it leaves.
SERVER_TRANSITIONS: Mapping[ServerState, frozenset[ServerState]] = {
    _S.STARTING: frozenset({_S.HANDSHAKE, _S.STOPPED, _S.FAILED}),
    _S.HANDSHAKE: frozenset({_S.HANDSHAKE, _S.TRAINING, *_ENDS_S}),
    _S.TRAINING: frozenset(
        {_S.TRAINING, _S.MID_STEP, _S.VALIDATING, _S.HANDSHAKE, _S.COMPLETED, *_ENDS_S}
    ),
    _S.MID_STEP: frozenset({_S.TRAINING, _S.HANDSHAKE, _S.FAILED}),
    _S.VALIDATING: frozenset({_S.VALIDATING, _S.HANDSHAKE, _S.COMPLETED, *_ENDS_S}),
    _S.COMPLETED: frozenset(),
    _S.PAUSED: frozenset(),
    _S.STOPPED: frozenset(),
    _S.FAILED: frozenset(),
}

_C = ClientState
#: Every allowed transition of the hospital's side, by the state it leaves.
CLIENT_TRANSITIONS: Mapping[ClientState, frozenset[ClientState]] = {
    _C.STARTING: frozenset({_C.HANDSHAKE, _C.INTERRUPTED, _C.FAILED}),
    _C.HANDSHAKE: frozenset({_C.HANDSHAKE, _C.RUNNING, _C.INTERRUPTED, _C.FAILED}),
    _C.RUNNING: frozenset(
        {_C.HANDSHAKE, _C.COMPLETED, _C.PAUSED, _C.STOPPED, _C.INTERRUPTED, _C.FAILED}
    ),
    _C.COMPLETED: frozenset(),
    _C.PAUSED: frozenset(),
    _C.STOPPED: frozenset(),
    _C.INTERRUPTED: frozenset(),
    _C.FAILED: frozenset(),
}

S = TypeVar("S", ServerState, ClientState)


class TurnState(Generic[S]):
    """One side's current state; :meth:`to` moves it along its table only."""

    def __init__(self, table: Mapping[S, frozenset[S]], start: S, *, side: str) -> None:
        self.table = table
        self.side = side
        self._state = start

    @property
    def now(self) -> S:
        return self._state

    def to(self, new: S) -> None:
        """Move to ``new``.

        Raises:
            TurnStateError: the table holds no such transition, naming what it holds.
        """
        allowed = self.table[self._state]
        if new not in allowed:
            options = ", ".join(sorted(s.value for s in allowed)) or "none (a final state)"
            raise TurnStateError(
                f"the {self.side}'s side of a turn cannot go from {self._state.value!r} to "
                f"{new.value!r}; from {self._state.value!r} it may go to: {options}"
            )
        self._state = new

    def is_final(self) -> bool:
        return not self.table[self._state]

    def __repr__(self) -> str:
        return f"<TurnState {self.side} {self._state.value}>"
