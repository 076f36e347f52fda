"""The hospital's side of one turn over a relay: train, validate, report, come back.

:class:`TurnClient` runs a hospital's turn against a :class:`~medsplit.turns.server.TurnServer`
in another process. It starts every run with the handshake of
:mod:`medsplit.turns.control`, so it may be started before the server, after it, or again
after either side died: it rolls its segments back to the snapshot the server chooses
and continues from there. Batches are the job's deterministic sequence
(:func:`medsplit.training.schedule.turn_batches`), so steps done again are the same steps.

Its states and their transitions are :data:`~medsplit.turns.states.CLIENT_TRANSITIONS`;
its frames go through a :class:`~medsplit.turns.frameio.FrameIO`; the steps are the
mode's client role's, validation the mode's
:meth:`~medsplit.modes.SplitMode.eval_activations` and
:meth:`~medsplit.modes.SplitMode.eval_logits`, and when to snapshot a
:class:`~medsplit.turns.checkpoints.CheckpointPolicy`.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.defenses.accounting import Spent
from medsplit.defenses.client import DefendedClient
from medsplit.errors import ConfigError, MedSplitError, ProtocolError
from medsplit.modes import get_mode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.handoff import export_parties, import_parties, read_notes
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, StepResult
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import defended_role
from medsplit.training.evaluate import task_metrics
from medsplit.training.schedule import Batch, turn_batches, turn_limits
from medsplit.turns import control
from medsplit.turns.checkpoints import CheckpointPolicy
from medsplit.turns.frameio import FrameCounters, FrameIO
from medsplit.turns.hijack_guard import HijackGuard, SplitGuardCheck
from medsplit.turns.states import CLIENT_TRANSITIONS, ClientState, TurnState
from medsplit.turns.stores import StateStore
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind

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
    #: The activation noise's ε spent at this hospital over the job so far (its
    #: :meth:`~medsplit.defenses.accounting.Spent.to_json`); ``None`` without it.
    privacy_spent: dict[str, float | int] | None = None

    @property
    def computing_seconds(self) -> float:
        return self.total_seconds - self.waiting_seconds


class TurnRecord:
    """The losses of a turn's training steps and the logits of its validation batches:
    what the hospital's metrics are made of. The losses also travel in its snapshots,
    so a restarted agent reports the loss of the whole turn, not of the steps since it
    came back (never in what is handed on)."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.eval_logits: dict[int, torch.Tensor] = {}

    def notes(self) -> dict[str, str]:
        return {LOSSES_NOTE: json.dumps({str(s): v for s, v in sorted(self.losses.items())})}

    def restored(self, snapshot: bytes, step: int) -> None:
        """Back to "before ``step``": what a snapshot kept joins, later entries go."""
        kept = read_notes(snapshot).get(LOSSES_NOTE)
        if kept:
            # Those of this run win: the same steps, done again, give the same losses.
            self.losses = {**_losses_of(kept), **self.losses}
        self.losses = {s: v for s, v in self.losses.items() if s < step}
        self.eval_logits = {s: v for s, v in self.eval_logits.items() if s < step}

    def metrics(
        self,
        val: DataSplit | None,
        eval_steps: int,
        *,
        task: str = "classification",
        loss_fn: LossFn | None = None,
    ) -> dict[str, float]:
        values: dict[str, float] = {}
        if self.losses:
            values["train_loss"] = sum(self.losses.values()) / len(self.losses)
        if val is not None and eval_steps and len(self.eval_logits) == eval_steps:
            logits = torch.cat([self.eval_logits[s] for s in sorted(self.eval_logits)])
            labels = val.labels[: logits.shape[0]]
            values.update(task_metrics(task, logits, labels, loss_fn=loss_fn))
        return values


class TurnClient:
    """Runs one hospital's turn (see the module docstring).

    Args:
        ids: the turn's job, round, position, mode and codec.
        channel, streams: the relay and this hospital's streams.
        split: the job's split model (its client segments are built from it).
        parties: builds the hospital's parties (those of the mode's
            ``client_segments()``) with their optimizers; their state comes from the
            snapshots.
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
        role: builds the hospital's step role over its parties (default: the mode's
            :meth:`~medsplit.modes.SplitMode.client_role`); a vertical party's is its own.
        batches: the batches of a round's turn, from step 0 (default: ``train`` as
            :func:`~medsplit.training.schedule.turn_batches` deals it); a vertical party's
            follow the aligned records' order drawn from the job's seed.
        extra_metrics: values the metrics frame carries beside the turn's own (an
            evaluation's majority-class baseline: :mod:`medsplit.turns.evaluation`).
        guard: judges every gradient frame at the front's cut before it is applied
            (:mod:`medsplit.turns.hijack_guard`); by default one fitted here when the
            job turns ``privacy.hijack_detection`` on. Once it has tripped, every run
            raises :class:`~medsplit.defenses.hijack.HijackDetected` at once. With
            method ``splitguard`` (:class:`~medsplit.turns.hijack_guard.SplitGuardCheck`)
            some steps send fake labels; their gradients are judged and not applied here
            (the front is put back as it was before the step), nor their loss kept.

    What changes while it runs: :attr:`turn_state`, :attr:`parties`, :attr:`role`,
    :attr:`position`, :attr:`policy`, the batches, :attr:`record` and
    :attr:`resumed_at`; the rest is set once.
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
        train: DataSplit,
        val: DataSplit | None,
        snapshots: StateStore,
        reply_timeout: float = 600.0,
        loss_fn: LossFn | None = None,
        on_step: StepCallback | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        stop: threading.Event | None = None,
        device: str = "cpu",
        limits: FrameLimits | None = None,
        role: Callable[[dict[str, Party]], ClientRole] | None = None,
        batches: Callable[[int], Iterator[Batch]] | None = None,
        extra_metrics: Mapping[str, float] | None = None,
        guard: HijackGuard | SplitGuardCheck | None = None,
    ) -> None:
        self.ids = ids
        self.extra_metrics = dict(extra_metrics or {})
        # The job's mode bound to its options (SplitFed's labels change the roles).
        self.mode = config.split_mode if config.mode == ids.mode else get_mode(ids.mode)
        self.channel = channel
        self.streams = streams
        self.io = FrameIO(
            channel,
            inbound=streams.down,
            outbound=streams.up,
            ids=ids,
            max_frame_bytes=max_frame_bytes,
            where=f"turn {ids.position} of round {ids.round}",
        )
        self.split = split
        self.make_parties = parties
        self.config = config
        self.train = train
        self.val = val
        self.snapshots = snapshots
        self.reply_timeout = reply_timeout
        self.loss_fn = loss_fn or config.loss_fn()  # the job's task's by default
        self.on_step = on_step
        self.stop = stop or threading.Event()
        self.device = torch.device(device)
        self._role_factory = role
        self._batches_of = batches
        if 0 not in snapshots.steps():
            snapshots.save(0, start)
        own = turn_limits(
            config,
            num_classes=limits.num_classes if limits is not None else None,
            train=len(train),
            val=len(val) if val is not None else 0,
            label_shape=tuple(train.labels.shape[1:]),  # a class index, or a mask
        )
        if limits is not None and limits != own:
            raise ConfigError(f"the turn's limits {limits} are not those of this data: {own}")
        self.limits = own
        if guard is None and config.privacy.hijack_detection is not None:
            guard = self._simulated_guard(start)
        self.guard = guard
        self._labels: torch.Tensor | None = None
        self._true_labels: torch.Tensor | None = None
        #: The state before the step in flight, when it is a SplitGuard fake batch.
        self._before_fake: bytes | None = None
        self.turn_state = TurnState(CLIENT_TRANSITIONS, ClientState.STARTING, side="hospital")
        self.parties: dict[str, Party] = {}
        self.role: ClientRole | None = None
        self.position = 0
        self.policy = CheckpointPolicy(1)  # until the server's resume says otherwise
        self._batches: Iterator[Batch] = iter(())
        self._in_step = False
        self.record = TurnRecord()
        #: Every step this turn resumed at, over all runs (a run cut short included).
        self.resumed_at: list[int] = []

    def _simulated_guard(self, start: bytes) -> HijackGuard | SplitGuardCheck:
        options = self.config.privacy.hijack_detection
        if options is not None and options.method == "splitguard":
            return SplitGuardCheck.of(
                split=self.split, config=self.config, classes=self.limits.num_classes or 2
            )
        parties = self.make_parties()
        import_parties(start, parties)
        return HijackGuard.simulated(
            split=self.split,
            config=self.config,
            parties=parties,
            train=self.train,
            loss_fn=self.loss_fn,
        )

    @property
    def train_steps(self) -> int:
        return self.limits.train_steps or 0

    @property
    def eval_steps(self) -> int:
        return self.limits.eval_steps or 0

    @property
    def metrics_step(self) -> int:
        """The step that carries the metrics: after every training and validation step."""
        return self.train_steps + self.eval_steps

    @property
    def checkpoint_every(self) -> int:
        return self.policy.every

    def spent(self) -> Spent | None:
        """The activation noise's ε spent here over the job so far (``None``: no noise)."""
        if isinstance(self.role, DefendedClient):
            return self.role.spent()
        return None

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
            HijackDetected: the guard found the server's gradients unlike honest ones;
                the frame that tripped it was not applied.
        """
        if self.guard is not None and self.guard.detector.tripped is not None:
            raise self.guard.detector.tripped  # no further step of a hijacked job
        report = ClientReport(ClientOutcome.STOPPED)
        self.io.counters = FrameCounters()
        # Each run is a new start of this side: a hello, a handshake.
        self.turn_state = TurnState(CLIENT_TRANSITIONS, ClientState.STARTING, side="hospital")
        began = time.monotonic()
        try:
            return self._run(report)
        except FrameRejected as e:
            self._failed()
            refused = e.sent_by(SERVER)
            logger.error("turn %s of round %s: %s", self.ids.position, self.ids.round, refused)
            raise refused from e
        except Exception:
            self._failed()
            raise
        finally:
            counters = self.io.counters
            report.bytes_up, report.bytes_down = counters.bytes_out, counters.bytes_in
            report.waiting_seconds = counters.waiting_seconds
            spent = self.spent()
            report.privacy_spent = spent.to_json() if spent is not None else None
            report.total_seconds = time.monotonic() - began

    def _failed(self) -> None:
        if not self.turn_state.is_final():
            self.turn_state.to(ClientState.FAILED)

    def _run(self, report: ClientReport) -> ClientReport:
        answered: int | None = None
        self.io.send(control.rejoin(self.ids, control.HELLO, self.snapshots.steps()))
        self.turn_state.to(ClientState.HANDSHAKE)
        while True:
            frame = self.io.next_frame(
                silence_timeout=self.reply_timeout,
                poll=_STOP_POLL_SECONDS,
                interrupted=self._stopping,
                silent=self._silent,
            )
            if frame is None:
                return self._interrupted(report)
            kind = frame.meta.kind
            if kind == FrameKind.SYNC:
                checks.conforms(frame, control.SYNC_SPEC)
                answered = control.nonce_of(frame)
                self.turn_state.to(ClientState.HANDSHAKE)
                self.io.send(control.rejoin(self.ids, answered, self.snapshots.steps()))
                continue
            if kind == FrameKind.RESUME:
                checks.conforms(frame, control.RESUME_SPEC)
                if control.nonce_of(frame) != answered:
                    continue  # an answer to an earlier handshake
                self._resume(frame, report)
                self.io.send(self._next_frame())
                continue
            if self.turn_state.now != ClientState.RUNNING:
                continue  # left over from before the handshake
            if kind in (FrameKind.DONE, FrameKind.STOPPED, FrameKind.PAUSED):
                checks.conforms(frame, control.SIGNAL_SPEC)
                return self._ended(kind, frame.meta.step, report)
            if frame.meta.step != self.position:
                self.io.drop(frame, f"step {frame.meta.step} is not step {self.position}")
                continue
            outgoing = self._handle(frame)
            if outgoing is not None:
                self.io.send(outgoing)

    def _resume(self, frame: Frame, report: ClientReport) -> None:
        step = frame.meta.step
        if step not in self.snapshots.steps():
            raise FrameRejected.of(
                frame,
                checks.HANDSHAKE,
                f"resumes at step {step}, but this hospital offered "
                f"snapshots before steps {self.snapshots.steps()} only",
            )
        self.policy = CheckpointPolicy(max(1, int(frame.tensors[control.EVERY])))
        self._restore(step)
        report.resumed_at.append(step)
        self.resumed_at.append(step)
        if self.turn_state.now == ClientState.HANDSHAKE:
            self.turn_state.to(ClientState.RUNNING)

    def _stopping(self) -> bool:
        """Asked to stop, and no step is half done (a step in flight is finished first)."""
        return self.stop.is_set() and not self._in_step

    def _silent(self, waited: float, relay_error: str) -> ServerSilent:
        return ServerSilent(
            f"the server sent nothing for {self.reply_timeout:g} s during turn "
            f"{self.ids.position} of round {self.ids.round}{relay_error}"
        )

    def _interrupted(self, report: ClientReport) -> ClientReport:
        if self.role is not None and self.position <= self.train_steps:
            self.snapshots.save(self.position, self._snapshot())  # nothing of it applied yet
        report.outcome = ClientOutcome.INTERRUPTED
        report.steps = min(self.position, self.train_steps)
        self.turn_state.to(ClientState.INTERRUPTED)
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
                if self._before_fake is not None:  # a fake batch's forward moved no buffer
                    import_parties(self._before_fake, self.parties)
                    self._before_fake = None
                # Nothing of step `step` was applied yet: this is the state "before" it.
                self.snapshots.save(step, self._snapshot())
        else:
            report.outcome = ClientOutcome.STOPPED
        self.turn_state.to(ClientState(report.outcome.value))
        logger.info("turn %s at step %d: %s", self.ids.position, step, report.outcome)
        return report

    def _snapshot(self) -> bytes:
        """The state, and the losses of the turn's steps so far (:class:`TurnRecord`)."""
        return export_parties(self.parties, notes=self.record.notes())

    def _restore(self, step: int) -> None:
        self.parties = self.make_parties()
        for party in self.parties.values():
            party.module.to(self.device)  # in place: the optimizer keeps its parameters
        snapshot = self.snapshots.load(step)
        import_parties(snapshot, self.parties)
        self.record.restored(snapshot, step)
        if self._role_factory is not None:
            role = self._role_factory(self.parties)
        else:
            role = self.mode.client_role(
                self.parties, self.split, codec=self.ids.codec, loss_fn=self.loss_fn
            )
        # The job's defenses, the same here as in process (medsplit.training.defended).
        self.role = defended_role(
            role,
            self.parties,
            self.config,
            records=len(self.train),
            round_=self.ids.round,
            classes=self.limits.num_classes,
        )
        if isinstance(self.role, DefendedClient):
            self.role.steps_done = min(step, self.train_steps)
        self._in_step = False
        self.position = step
        first = min(step, self.train_steps)
        if self._batches_of is not None:
            self._batches = itertools.islice(self._batches_of(self.ids.round), first, None)
        else:
            # From step `first` on: the steps before it are not built (nor augmented) again.
            self._batches = turn_batches(
                self.config,
                self.train,
                round_=self.ids.round,
                hospital=self.ids.position,
                first_step=first,
            )

    # -- steps --------------------------------------------------------------------------

    def _next_frame(self) -> Frame:
        """What to send for step ``position``: a batch, a validation batch or the metrics."""
        assert self.role is not None
        if self.position < self.train_steps:
            batch = next(self._batches)
            self._in_step = True
            y = self._true_labels = batch.y
            self._before_fake = None
            if isinstance(self.guard, SplitGuardCheck):
                fake = self.guard.labels(y, round_=self.ids.round, step=self.position)
                if fake is not None:  # kept to put the front back: a fake step teaches nothing
                    self._before_fake = export_parties(self.parties)
                    y = fake
            self._labels = y
            return self.role.start(batch.ids, batch.x.to(self.device), y.to(self.device))
        if self.position < self.metrics_step:
            x = self._val_images(self.position - self.train_steps).to(self.device)
            # How validation crosses the cut is the mode's (medsplit.modes).
            out = self.mode.eval_activations(self.parties, x)
            return self.ids.frame(FrameKind.EVAL_ACTIVATIONS, self.position, out)
        return control.metrics(self.ids, self.position, self._metrics())

    def _handle(self, frame: Frame) -> Frame | None:
        assert self.role is not None
        if frame.meta.kind == FrameKind.EVAL_OUTPUTS:
            if not self.train_steps <= self.position < self.metrics_step:
                raise ProtocolError(f"validation output for step {self.position} is out of place")
            self.record.eval_logits[self.position] = self._logits(frame).cpu()
            self.position += 1
            return self._next_frame()
        if not self._in_step:
            raise ProtocolError(f"a {frame.meta.kind} frame came with no step in flight")
        fake = self._before_fake is not None
        if isinstance(self.guard, SplitGuardCheck):
            assert self._true_labels is not None
            self.guard.check(frame, fake=fake, labels=self._true_labels)  # before applying
        elif self.guard is not None:
            self.guard.check(frame, self._labels)  # before anything of it is applied
        # The role checks the frame (form, batch, finite values) before applying it.
        result = self.role.receive(self._on_device(frame))
        if isinstance(result, Frame):
            return result
        self._in_step = False
        if self._before_fake is not None:
            # SplitGuard's fake batch: the front (weights, buffers, optimizer) as before it.
            import_parties(self._before_fake, self.parties)
            self._before_fake = None
        elif not math.isnan(result.loss):  # a vertical passive party never learns the loss
            self.record.losses[self.position] = result.loss
        if self.on_step is not None and not fake:
            self.on_step(result)
        self.position += 1
        if self.policy.due(self.position, train_steps=self.train_steps):
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

    def _val_images(self, index: int) -> torch.Tensor:
        assert self.val is not None
        size = self.config.batch_size
        return self.val.images[index * size : (index + 1) * size]

    def _metrics(self) -> dict[str, float]:
        measured = self.record.metrics(
            self.val, self.eval_steps, task=self.config.task, loss_fn=self.loss_fn
        )
        return {**measured, **self.extra_metrics}


def _losses_of(text: str) -> dict[int, float]:
    """The losses a snapshot kept; nothing when they do not read (an older snapshot)."""
    try:
        return {int(step): float(loss) for step, loss in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError):
        return {}
