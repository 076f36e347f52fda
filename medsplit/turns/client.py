"""The hospital's side of one turn over a relay: train, validate, report, come back.

:class:`TurnClient` runs a hospital's turn against a :class:`~medsplit.turns.server.TurnServer`
in another process. It starts every run with the handshake of
:mod:`medsplit.turns.control`, so it may be started before the server, after it, or again
after either side died: it rolls its segments back to the snapshot the server chooses
and continues from there. Batches are the job's deterministic sequence
(:func:`medsplit.training.schedule.turn_batches`), so steps done again are the same steps.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.data import Split
from medsplit.errors import ChannelTimeout, ConfigError, FrameError, MedSplitError, ProtocolError
from medsplit.modes import get_mode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.handoff import export_parties, import_parties, read_notes
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, StepResult
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import classification_metrics, eval_mode
from medsplit.training.schedule import Batch, turn_batches, turn_limits
from medsplit.turns import control
from medsplit.turns.snapshots import SnapshotStore
from medsplit.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    FrameKind,
    decode_frame,
    encode_frame,
)

logger = logging.getLogger(__name__)

#: Who sends what this side receives, as refusals name it.
SERVER = "the server"

StepCallback = Callable[[StepResult], None]
_STOP_POLL_SECONDS = 1.0
LOSSES_NOTE = "turn_losses"


class ClientOutcome(StrEnum):
    COMPLETED = "completed"
    PAUSED = "paused"  # run again to continue when the job resumes
    STOPPED = "stopped"  # the turn is over without completing (cancelled, taken away)
    INTERRUPTED = "interrupted"  # this side was asked to stop; run again to continue


class ServerSilent(MedSplitError):
    """The server sent nothing for longer than the reply timeout."""


@dataclass
class ClientReport:
    """How a run of a turn ended, and what the hospital measured."""

    outcome: ClientOutcome
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_at: list[int] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    #: Seconds this run spent waiting for the server's frames, and everything else
    #: (computing, encoding, sending).
    waiting_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def computing_seconds(self) -> float:
        return self.total_seconds - self.waiting_seconds


class TurnClient:
    """Runs one hospital's turn (see the module docstring).

    Args:
        ids: the turn's job, round, position, mode and codec.
        channel, streams: the relay and this hospital's streams.
        split: the job's split model (its client segments are built from it).
        parties: builds the hospital's parties (``front``, and ``head`` in U-shaped
            mode) with their optimizers; their state comes from the snapshots.
        start: the state the turn starts from (the hand-off), kept as the snapshot
            before step 0 unless ``snapshots`` already has one.
        config: the job's training configuration.
        train, val: local data; neither ever leaves this process.
        snapshots: where this turn's snapshots live (kept across runs of the turn).
        reply_timeout: seconds without a frame from the server before giving up.
        stop: when set, the run ends after the step in flight, with a snapshot to come
            back to (:attr:`ClientOutcome.INTERRUPTED`): a clean shutdown.
        device: where the hospital's segments run (``cpu`` or ``cuda``); frames cross
            as CPU tensors either way.
        limits: what the server's frames must fit: ``turn_limits`` over this hospital's
            own data and the job's classes (:mod:`medsplit.training.schedule`); by default
            the same without the classes, so validation logits of any width pass.
    """

    def __init__(
        self,
        *,
        ids: control.TurnIds,
        channel: Channel,
        streams: StreamPair,
        split: SplitModel,
        parties: Callable[[], dict[str, Party]],
        start: bytes,
        config: TrainingConfig,
        train: Split,
        val: Split | None,
        snapshots: SnapshotStore,
        reply_timeout: float = 600.0,
        loss_fn: LossFn | None = None,
        on_step: StepCallback | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        stop: threading.Event | None = None,
        device: str = "cpu",
        limits: FrameLimits | None = None,
    ) -> None:
        self.ids = ids
        self.mode = get_mode(ids.mode)
        self.channel = channel
        self.streams = streams
        self.split = split
        self.make_parties = parties
        self.config = config
        self.train = train
        self.val = val
        self.snapshots = snapshots
        self.reply_timeout = reply_timeout
        self.loss_fn = loss_fn
        self.on_step = on_step
        self.max_frame_bytes = max_frame_bytes
        self.stop = stop or threading.Event()
        self.device = torch.device(device)
        if 0 not in snapshots.steps():
            snapshots.save(0, start)
        own = turn_limits(
            config,
            num_classes=limits.num_classes if limits is not None else None,
            train=len(train),
            val=len(val) if val is not None else 0,
        )
        if limits is not None and limits != own:
            raise ConfigError(f"the turn's limits {limits} are not those of this data: {own}")
        self.limits = own
        self.train_steps = own.train_steps or 0
        self.eval_steps = own.eval_steps or 0
        self.parties: dict[str, Party] = {}
        self.role: ClientRole | None = None
        self.position = 0
        self.checkpoint_every = 1
        self._batches: Iterator[Batch] = iter(())
        self._losses: dict[int, float] = {}
        self._eval_logits: dict[int, torch.Tensor] = {}
        self._in_step = False
        #: Every step this turn resumed at, over all runs (a run cut short included).
        self.resumed_at: list[int] = []

    @property
    def metrics_step(self) -> int:
        """The step that carries the metrics: after every training and validation step."""
        return self.train_steps + self.eval_steps

    def state(self) -> bytes:
        """The hospital's current training state (what it hands on after the turn)."""
        return export_parties(self.parties)

    # -- the turn -----------------------------------------------------------------------

    def run(self) -> ClientReport:
        """Take part in the turn until the server says it is done, paused or stopped.

        Raises:
            ServerSilent: nothing came from the server within ``reply_timeout``.
            ChannelError: the relay failed.
            FrameRejected: a frame of the server failed a check (its form, batch, finite
                values); nothing of it was applied, and the snapshots are as they were.
            ProtocolError: the server sent frames that break the protocol.
        """
        report = ClientReport(ClientOutcome.STOPPED)
        began = time.monotonic()
        try:
            return self._run(report)
        except FrameRejected as e:
            refused = e.sent_by(SERVER)
            logger.error("turn %s of round %s: %s", self.ids.position, self.ids.round, refused)
            raise refused from e
        finally:
            report.total_seconds = time.monotonic() - began

    def _run(self, report: ClientReport) -> ClientReport:
        answered: int | None = None
        running = False
        self._send(control.rejoin(self.ids, control.HELLO, self.snapshots.steps()), report)
        while True:
            if self._stopping():
                return self._interrupted(report)
            frame = self._receive(report)
            if frame is None:
                return self._interrupted(report)
            kind = frame.meta.kind
            if kind == FrameKind.SYNC:
                checks.conforms(frame, control.SYNC_SPEC)
                answered, running = control.nonce_of(frame), False
                self._send(control.rejoin(self.ids, answered, self.snapshots.steps()), report)
                continue
            if kind == FrameKind.RESUME:
                checks.conforms(frame, control.RESUME_SPEC)
                if control.nonce_of(frame) != answered:
                    continue  # an answer to an earlier handshake
                if frame.meta.step not in self.snapshots.steps():
                    raise FrameRejected.of(
                        frame,
                        checks.HANDSHAKE,
                        f"resumes at step {frame.meta.step}, but this hospital offered "
                        f"snapshots before steps {self.snapshots.steps()} only",
                    )
                self.checkpoint_every = max(1, int(frame.tensors[control.EVERY]))
                self._restore(frame.meta.step)
                report.resumed_at.append(frame.meta.step)
                self.resumed_at.append(frame.meta.step)
                running = True
                self._send(self._next_frame(), report)
                continue
            if not running:
                continue  # left over from before the handshake
            if kind in (FrameKind.DONE, FrameKind.STOPPED, FrameKind.PAUSED):
                checks.conforms(frame, control.SIGNAL_SPEC)
                return self._ended(kind, frame.meta.step, report)
            if frame.meta.step != self.position:
                logger.info("dropped a %s frame for step %d", kind, frame.meta.step)
                continue
            outgoing = self._handle(frame)
            if outgoing is not None:
                self._send(outgoing, report)

    def _stopping(self) -> bool:
        """Asked to stop, and no step is half done (a step in flight is finished first)."""
        return self.stop.is_set() and not self._in_step

    def _interrupted(self, report: ClientReport) -> ClientReport:
        if self.role is not None and self.position <= self.train_steps:
            self.snapshots.save(self.position, self._snapshot())  # nothing of it applied yet
        report.outcome = ClientOutcome.INTERRUPTED
        report.steps = min(self.position, self.train_steps)
        logger.info("turn %s interrupted before step %d", self.ids.position, self.position)
        return report

    def _ended(self, kind: FrameKind, step: int, report: ClientReport) -> ClientReport:
        report.steps = min(self.position, self.train_steps)
        if kind == FrameKind.DONE:
            report.outcome = ClientOutcome.COMPLETED
            report.metrics = self._metrics()
        elif kind == FrameKind.PAUSED:
            report.outcome = ClientOutcome.PAUSED
            if step == self.position and step <= self.train_steps:
                # Nothing of step `step` was applied yet: this is the state "before" it.
                self.snapshots.save(step, self._snapshot())
        else:
            report.outcome = ClientOutcome.STOPPED
        logger.info("turn %s at step %d: %s", self.ids.position, step, report.outcome)
        return report

    def _snapshot(self) -> bytes:
        """The state, and the losses of the turn's steps so far: a restarted agent reports
        the loss of the whole turn, not of the steps since it came back. Kept in the
        snapshot only, never in what is handed on."""
        losses = json.dumps({str(s): v for s, v in sorted(self._losses.items())})
        return export_parties(self.parties, notes={LOSSES_NOTE: losses})

    def _restore(self, step: int) -> None:
        self.parties = self.make_parties()
        for party in self.parties.values():
            party.module.to(self.device)  # in place: the optimizer keeps its parameters
        snapshot = self.snapshots.load(step)
        import_parties(snapshot, self.parties)
        kept = read_notes(snapshot).get(LOSSES_NOTE)
        if kept:
            # Those of this run win: the same steps, done again, give the same losses.
            self._losses = {**_losses_of(kept), **self._losses}
        self.role = self.mode.client_role(
            self.parties, self.split, codec=self.ids.codec, loss_fn=self.loss_fn
        )
        self.position = step
        self._in_step = False
        batches = turn_batches(
            self.config, self.train, round_=self.ids.round, hospital=self.ids.position
        )
        self._batches = itertools.islice(batches, min(step, self.train_steps), None)
        self._losses = {s: v for s, v in self._losses.items() if s < step}
        self._eval_logits = {s: v for s, v in self._eval_logits.items() if s < step}

    # -- steps --------------------------------------------------------------------------

    def _next_frame(self) -> Frame:
        """What to send for step ``position``: a batch, a validation batch or the metrics."""
        assert self.role is not None
        if self.position < self.train_steps:
            batch = next(self._batches)
            self._in_step = True
            return self.role.start(batch.ids, batch.x.to(self.device), batch.y.to(self.device))
        if self.position < self.metrics_step:
            x, _ = self._val_batch(self.position - self.train_steps)
            x = x.to(self.device)
            with eval_mode([self.parties["front"].module]), torch.no_grad():
                out = self.parties["front"].module(x)
            return self.ids.frame(FrameKind.EVAL_ACTIVATIONS, self.position, out)
        return control.metrics(self.ids, self.position, self._metrics())

    def _handle(self, frame: Frame) -> Frame | None:
        assert self.role is not None
        if frame.meta.kind == FrameKind.EVAL_OUTPUTS:
            if not self.train_steps <= self.position < self.metrics_step:
                raise ProtocolError(f"validation output for step {self.position} is out of place")
            self._eval_logits[self.position] = self._logits(frame).cpu()
            self.position += 1
            return self._next_frame()
        if not self._in_step:
            raise ProtocolError(f"a {frame.meta.kind} frame came with no step in flight")
        # The role checks the frame (form, batch, finite values) before applying it.
        result = self.role.receive(self._on_device(frame))
        if isinstance(result, Frame):
            return result
        self._in_step = False
        self._losses[self.position] = result.loss
        if self.on_step is not None:
            self.on_step(result)
        self.position += 1
        if self.position % self.checkpoint_every == 0 or self.position == self.train_steps:
            self.snapshots.save(self.position, self._snapshot())
        if self.stop.is_set():
            return None  # the run loop ends here, with a snapshot before the next step
        return self._next_frame()

    def _on_device(self, frame: Frame) -> Frame:
        if self.device.type == "cpu":
            return frame
        return Frame(frame.meta, {k: t.to(self.device) for k, t in frame.tensors.items()})

    def _logits(self, frame: Frame) -> torch.Tensor:
        """The validation batch's logits from an ``eval_outputs`` frame, checked."""
        samples = self.limits.eval_batch(self.position - self.train_steps) or 0
        # How validation crosses the cut back is the mode's (medsplit.modes).
        return self.mode.eval_logits(
            frame,
            parties=self.parties,
            split=self.split,
            samples=samples,
            limits=self.limits,
            device=self.device,
        )

    def _val_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.val is not None
        size = self.config.batch_size
        return (
            self.val.images[index * size : (index + 1) * size],
            self.val.labels[index * size : (index + 1) * size],
        )

    def _metrics(self) -> dict[str, float]:
        values: dict[str, float] = {}
        if self._losses:
            values["train_loss"] = sum(self._losses.values()) / len(self._losses)
        if self.val is not None and self.eval_steps and len(self._eval_logits) == self.eval_steps:
            logits = torch.cat([self._eval_logits[s] for s in sorted(self._eval_logits)])
            values.update(classification_metrics(logits, self.val.labels[: logits.shape[0]]))
        return values

    # -- frames -------------------------------------------------------------------------

    def _receive(self, report: ClientReport) -> Frame | None:
        """The next frame of this turn from the server; ``None`` when asked to stop while
        no step is in flight."""
        deadline = time.monotonic() + self.reply_timeout
        while True:
            if self._stopping():
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerSilent(
                    f"the server sent nothing for {self.reply_timeout:g} s during turn "
                    f"{self.ids.position} of round {self.ids.round}"
                )
            waiting = time.monotonic()
            try:
                payload = self.channel.receive(
                    self.streams.down, timeout=min(remaining, _STOP_POLL_SECONDS)
                )
            except ChannelTimeout:
                continue
            finally:
                report.waiting_seconds += time.monotonic() - waiting
            report.bytes_down += len(payload)
            try:
                frame = decode_frame(payload, max_bytes=self.max_frame_bytes)
            except FrameError as e:
                raise FrameRejected(checks.WELL_FORMED, f"bytes that are not a frame: {e}") from e
            if self.ids.owns(frame):
                return frame
            logger.info("dropped a frame of another turn (%s)", frame.meta)
            deadline = time.monotonic() + self.reply_timeout

    def _send(self, frame: Frame, report: ClientReport) -> None:
        payload = encode_frame(frame, max_bytes=self.max_frame_bytes)
        self.channel.send(self.streams.up, payload)
        report.bytes_up += len(payload)


def _losses_of(text: str) -> dict[int, float]:
    """The losses a snapshot kept; nothing when they do not read (an older snapshot)."""
    try:
        return {int(step): float(loss) for step, loss in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError):
        return {}
