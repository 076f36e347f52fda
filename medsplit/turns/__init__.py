"""A turn over a relay between processes: the hospital's driver, the server's driver, and
the handshake, checkpoints and snapshots that let either side die and come back.

See ``docs/protocol.md`` ("A turn over the relay").
"""

from medsplit.turns.checkpoints import CheckpointStore, MemoryCheckpointStore
from medsplit.turns.client import ClientOutcome, ClientReport, ServerSilent, TurnClient
from medsplit.turns.control import TurnIds
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
from medsplit.turns.snapshots import MemorySnapshots, SnapshotStore

__all__ = [
    "CheckpointStore",
    "ClientOutcome",
    "ClientReport",
    "Directive",
    "FrameRefused",
    "HospitalSilent",
    "MemoryCheckpointStore",
    "MemorySnapshots",
    "RelayOverused",
    "ServerOutcome",
    "ServerSilent",
    "SnapshotStore",
    "TurnClient",
    "TurnFailed",
    "TurnHooks",
    "TurnIds",
    "TurnProgress",
    "TurnServer",
]
