"""A turn over a relay between processes: the hospital's driver, the server's driver, and
the handshake, checkpoints and snapshots that let either side die and come back; the
state tables of both sides, the frame I/O they share, and a server task that serves
several hospitals' streams on one segment.

See ``docs/protocol.md`` ("A turn over the relay").
"""

from medsplit.turns.checkpoints import CheckpointPolicy, MemoryCheckpointStore
from medsplit.turns.client import ClientOutcome, ClientReport, ServerSilent, TurnClient
from medsplit.turns.control import TurnIds
from medsplit.turns.frameio import FrameCounters, FrameIO
from medsplit.turns.multi import (
    HospitalStream,
    MultiStreamReport,
    MultiStreamServer,
    StepPolicy,
    StreamSet,
)
from medsplit.turns.server import (
    Directive,
    FrameRefused,
    HospitalSilent,
    RelayOverused,
    ServerOutcome,
    TurnFailed,
    TurnHooks,
    TurnProgress,
    TurnServer,
)
from medsplit.turns.snapshots import MemorySnapshots
from medsplit.turns.states import ClientState, ServerState, TurnStateError
from medsplit.turns.stores import StateStore, StoreError

__all__ = [
    "CheckpointPolicy",
    "ClientOutcome",
    "ClientReport",
    "ClientState",
    "Directive",
    "FrameCounters",
    "FrameIO",
    "FrameRefused",
    "HospitalSilent",
    "HospitalStream",
    "MemoryCheckpointStore",
    "MemorySnapshots",
    "MultiStreamReport",
    "MultiStreamServer",
    "RelayOverused",
    "ServerOutcome",
    "ServerSilent",
    "ServerState",
    "StateStore",
    "StepPolicy",
    "StoreError",
    "StreamSet",
    "TurnClient",
    "TurnFailed",
    "TurnHooks",
    "TurnIds",
    "TurnProgress",
    "TurnServer",
    "TurnStateError",
]
