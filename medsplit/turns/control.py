"""The control frames of a turn: the handshake, the end of a turn, pause and stop.

Every (re)start of either side is one handshake, so a fresh turn, a worker taking a turn
over and a hospital coming back all go the same way::

    server ── sync(nonce) ──────────────────────▶ hospital
    server ◀── rejoin(nonce, snapshot steps) ─── hospital
    server ── resume(nonce, step s) ─────────────▶ hospital   (both restored to "before s")

A hospital starting (or coming back) first sends an unprompted ``rejoin`` with the nonce
:data:`HELLO`; a server waiting for an answer then sends its ``sync`` again with a new
nonce (the first may have been lost), and a server in the middle of a turn starts a new
handshake. The server picks ``s``: the latest step before which the hospital holds a snapshot and
after whose predecessor the server holds a checkpoint (``-1``, the turn's starting point,
is always on both sides, so a turn can always start over). The nonce ties the three
frames together, so frames of an earlier handshake, still queued on a stream, are told
apart and dropped. Control frames carry scalars only, never data.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from medsplit.protocol.checks import HANDSHAKE, METRICS, FrameRejected, conforms
from medsplit.protocol.roles import StepIds
from medsplit.wire import Frame, FrameKind, FrameSpec, TensorSpec

NONCE = "nonce"
SNAPSHOTS = "snapshots"
EVERY = "checkpoint_every"
MAX_SNAPSHOTS = 16
MAX_METRICS = 32
_METRIC_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_SCALAR = TensorSpec((), torch.int64)


@dataclass(frozen=True)
class TurnIds:
    """Where a turn sits in its job: every frame of the turn carries these ids
    (``mode`` is the mode's name)."""

    job: str
    round: int
    position: int
    mode: str
    codec: str = "none"

    def at(self, step: int) -> StepIds:
        return StepIds(self.job, self.round, self.position, step)

    def frame(self, kind: FrameKind, step: int, tensors: Mapping[str, torch.Tensor]) -> Frame:
        return Frame(self.at(step).meta(kind, self.mode, self.codec), tensors)

    def owns(self, frame: Frame) -> bool:
        """Whether ``frame`` belongs to this turn (job, round and position)."""
        m = frame.meta
        return (m.job, m.round, m.position) == (self.job, self.round, self.position)


#: The nonce of a hospital's unprompted rejoin: "I am here (again)", sent when it starts.
HELLO = 0


def new_nonce() -> int:
    return secrets.randbits(62) + 1  # never HELLO


def nonce_of(frame: Frame) -> int:
    """The nonce of a ``sync``, ``rejoin`` or ``resume`` frame already checked against its
    spec (:func:`checked_nonce` checks a ``rejoin`` first)."""
    return int(frame.tensors[NONCE])


def checked_nonce(frame: Frame) -> int:
    """The nonce of a ``rejoin`` frame, once it holds exactly a scalar nonce and snapshots.

    Raises:
        FrameRejected: the frame does not match :data:`REJOIN_SPEC` (``shape``).
    """
    conforms(frame, REJOIN_SPEC)
    return nonce_of(frame)


def sync(ids: TurnIds, nonce: int) -> Frame:
    return ids.frame(FrameKind.SYNC, 0, {NONCE: torch.tensor(nonce)})


def rejoin(ids: TurnIds, nonce: int, snapshots: Sequence[int]) -> Frame:
    """The hospital's answer to ``sync`` (or, with :data:`HELLO`, its unprompted one)."""
    steps = sorted(set(snapshots))[-MAX_SNAPSHOTS:]
    return ids.frame(
        FrameKind.REJOIN,
        0,
        {NONCE: torch.tensor(nonce), SNAPSHOTS: torch.tensor(steps, dtype=torch.int64)},
    )


def resume(ids: TurnIds, nonce: int, step: int, checkpoint_every: int) -> Frame:
    """Both sides are back "before ``step``"; the server checkpoints every so many steps."""
    return ids.frame(
        FrameKind.RESUME,
        step,
        {NONCE: torch.tensor(nonce), EVERY: torch.tensor(checkpoint_every)},
    )


def metrics(ids: TurnIds, step: int, values: Mapping[str, float]) -> Frame:
    """The hospital's validation (and training) metrics at the end of its turn."""
    return ids.frame(
        FrameKind.METRICS,
        step,
        {name: torch.tensor(float(v), dtype=torch.float64) for name, v in values.items()},
    )


def signal(ids: TurnIds, kind: FrameKind, step: int) -> Frame:
    """``done``, ``paused`` or ``stopped``: the server's word on the turn, at ``step``."""
    return ids.frame(kind, step, {})


# -- what each side accepts -------------------------------------------------------------

REJOIN_SPEC = FrameSpec(
    kind=FrameKind.REJOIN,
    tensors={NONCE: _SCALAR, SNAPSHOTS: TensorSpec((None,), torch.int64)},
)
SYNC_SPEC = FrameSpec(kind=FrameKind.SYNC, tensors={NONCE: _SCALAR})
RESUME_SPEC = FrameSpec(kind=FrameKind.RESUME, tensors={NONCE: _SCALAR, EVERY: _SCALAR})
SIGNAL_SPEC = FrameSpec(tensors={})


def snapshot_steps(frame: Frame) -> list[int]:
    """The steps a ``rejoin`` frame offers, checked (``handshake``)."""
    steps = frame.tensors[SNAPSHOTS].tolist()
    if len(steps) > MAX_SNAPSHOTS or any(s < 0 for s in steps):
        raise FrameRejected.of(
            frame,
            HANDSHAKE,
            f"offers {len(steps)} snapshot steps {steps[:4]}...; "
            f"expected at most {MAX_SNAPSHOTS} steps >= 0",
        )
    return steps


def metric_values(frame: Frame) -> dict[str, float]:
    """The metrics of a ``metrics`` frame, checked: a few named finite scalars.

    Raises:
        FrameRejected: too many values, a bad name, a non-scalar or a non-finite value
            (``metrics``); :func:`medsplit.protocol.checks.check_metrics` then checks
            that the values can be true.
    """
    if len(frame.tensors) > MAX_METRICS:
        raise FrameRejected.of(
            frame, METRICS, f"holds {len(frame.tensors)} values, at most {MAX_METRICS}"
        )
    values: dict[str, float] = {}
    for name, t in frame.tensors.items():
        if not _METRIC_NAME.fullmatch(name) or t.dim() != 0 or not t.dtype.is_floating_point:
            raise FrameRejected.of(
                frame, METRICS, f"{name!r} must be a lower-case name with a floating scalar"
            )
        value = float(t)
        if value != value or value in (float("inf"), float("-inf")):
            raise FrameRejected.of(frame, METRICS, f"{name!r} is not finite ({value})")
        values[name] = value
    return values
