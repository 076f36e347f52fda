"""The server's side of one turn over a relay: handshake, steps, checkpoints, validation.

:class:`TurnServer` runs one hospital's turn from wherever the last checkpoint left it.
It knows nothing of databases or task queues: the caller (a Celery task in ``workers/``)
gives it a :class:`~medsplit.turns.checkpoints.CheckpointStore` and :class:`TurnHooks`
that record progress, say whether to pause or stop, and record the turn's end.

Layout of a turn's steps on the wire: ``0 .. T-1`` train (the mode's exchanges), then
``T .. T+V-1`` validate (``eval_activations`` up, ``eval_outputs`` down; nothing is
learnt), then step ``T+V`` carries the hospital's ``metrics``, answered by ``done``.
The server learns ``T`` when the first validation (or metrics) frame arrives.

Checkpoints: after answering step ``s - 1`` when ``s`` is a multiple of
``checkpoint_every``, at the end of training, and when paused. The answer goes first,
so the hospital, which snapshots "before s" once it has that answer, holds a snapshot
for every checkpoint but possibly the newest; the store keeps two for that reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.errors import (
    ChannelError,
    ChannelTimeout,
    CodecError,
    FrameError,
    MedSplitError,
    ProtocolError,
    RelayAbuse,
)
from medsplit.modes import get_mode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LOGITS, LOSS, LossFn, ServerRole, boundary_spec
from medsplit.training.evaluate import eval_mode
from medsplit.turns import control
from medsplit.turns.checkpoints import BASE, CheckpointStore
from medsplit.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    FrameKind,
    FrameSpec,
    decode_frame,
    encode_frame,
)

logger = logging.getLogger(__name__)

SERVER_PARTY = "server"
_TRAINING_KINDS = frozenset({FrameKind.ACTIVATIONS, FrameKind.HEAD_GRADIENTS})


class Directive(StrEnum):
    """What the coordinator wants of a running turn, asked once per step."""

    RUN = "run"
    PAUSE = "pause"  # checkpoint, tell the hospital, return: a later run resumes here
    STOP = "stop"  # tell the hospital, return: the turn is over (cancelled, lease lost)


class ServerOutcome(StrEnum):
    COMPLETED = "completed"
    PAUSED = "paused"
    STOPPED = "stopped"


_FIRST_START = "the turn's first start"


class TurnFailed(MedSplitError):
    """The turn cannot go on; the message says why and whose fault it is."""


class HospitalSilent(TurnFailed):
    """The hospital sent nothing for longer than the silence timeout."""


class FrameRefused(TurnFailed):
    """A hospital's frame failed a check (:mod:`medsplit.protocol.checks`): its turn
    attempt fails, and nothing of the frame was applied.

    Attributes:
        rejection: the refusal, naming the hospital, the frame and the check.
        check: the check's short name (``"finite"``, ``"labels in range"``, ...).
    """

    def __init__(self, rejection: FrameRejected) -> None:
        super().__init__(str(rejection))
        self.rejection = rejection
        self.check = rejection.check


class RelayOverused(TurnFailed):
    """The hospital put more on the relay than its job allows (an oversized frame, a
    flooded stream, keys beyond their bounds): its turn attempt fails, and the caller
    suspends its relay user (``workers/turn_runner.py``)."""


@dataclass
class TurnProgress:
    """Counters of a turn. ``steps`` and ``samples`` count the training steps the kept
    weights hold; bytes count every frame that crossed, re-done work included."""

    steps: int = 0
    samples: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    loss: float | None = None
    checkpoints: list[int] = field(default_factory=list)
    #: What crossed, as names and dtypes only: {"up"|"down": {kind: {tensor: dtype}}}.
    crossed: dict[str, dict[str, dict[str, str]]] = field(
        default_factory=lambda: {"up": {}, "down": {}}
    )

    def saw(self, direction: str, frame: Frame) -> None:
        kinds = self.crossed[direction].setdefault(frame.meta.kind.value, {})
        for name, tensor in frame.tensors.items():
            kinds.setdefault(name, str(tensor.dtype).removeprefix("torch."))


class TurnHooks(Protocol):
    """What the server's caller provides: the coordinator's side of the turn."""

    def directive(self) -> Directive:
        """Run, pause or stop; asked before every step and while waiting."""
        ...

    def progress(self, progress: TurnProgress) -> None:
        """A training step was applied (the caller bounds how often it stores this)."""
        ...

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        """The turn ended with the hospital's validation metrics; record it."""
        ...

    def resumed(self, step: int, reason: str) -> None:
        """The turn goes on from before ``step`` after a handshake other than its very
        first start (a new run of the server, the hospital coming back): record it."""
        ...


class _Interrupted(Exception):
    def __init__(self, directive: Directive) -> None:
        self.directive = directive


class TurnServer:
    """Serves one hospital's turn over ``channel`` (see the module docstring).

    Args:
        ids: the turn's job, round, position, mode and codec.
        channel, streams: the relay and this hospital's streams.
        split: the job's split model; ``party`` trains its server segment.
        party: the server segment with its optimizer (state is loaded from ``store``).
        store: this turn's checkpoints.
        hooks: the coordinator's side.
        batch_size: samples per training step, when no ``limits`` are given.
        limits: what this turn's frames may hold: ``turn_limits`` from the job and the
            hospital's reported split sizes (:mod:`medsplit.training.schedule`); every
            frame is checked against them before anything in it is applied.
        hospital: the hospital's name, for the reasons a turn fails with.
        checkpoint_every: steps between checkpoints (told to the hospital on resume).
        silence_timeout: seconds without a frame from the hospital before the turn fails.
        poll_interval: longest wait between two looks at the directive.
        initial: counters carried over from an earlier run of the same turn.
        reset_streams: start both streams afresh (a run taking the turn over after a
            failure, when stale frames or counters may be left on them).
    """

    def __init__(
        self,
        *,
        ids: control.TurnIds,
        channel: Channel,
        streams: StreamPair,
        split: SplitModel,
        party: Party,
        store: CheckpointStore,
        hooks: TurnHooks,
        batch_size: int | None = None,
        limits: FrameLimits | None = None,
        hospital: str | None = None,
        checkpoint_every: int = 50,
        silence_timeout: float = 120.0,
        poll_interval: float = 1.0,
        loss_fn: LossFn | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        initial: TurnProgress | None = None,
        reset_streams: bool = False,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        if limits is None:
            if batch_size is None:
                raise ValueError("give the turn's limits (or at least its batch_size)")
            limits = FrameLimits(batch_size=batch_size)
        elif batch_size is not None and batch_size != limits.batch_size:
            raise ValueError(f"batch_size {batch_size} differs from the limits' {limits}")
        self.ids = ids
        self.channel = channel
        self.streams = streams
        self.split = split
        self.party = party
        self.store = store
        self.hooks = hooks
        self.limits = limits
        self.batch_size = limits.batch_size
        #: Who sends this turn's frames, as the reasons a turn fails with name it.
        self.sender = f"hospital {hospital}" if hospital else "the hospital"
        self.checkpoint_every = checkpoint_every
        self.silence_timeout = silence_timeout
        self.poll_interval = poll_interval
        self.loss_fn = loss_fn
        self.max_frame_bytes = max_frame_bytes
        self.progress = initial or TurnProgress()
        self.reset_streams = reset_streams
        self.next_step = 0
        self.saved_through: int | None = None  # the checkpoint the weights equal, if any
        self.training_done = False
        self.nonce = 0
        self._mid_step = False
        self._answered = False  # the role holds the answer to step next_step - 1
        self._step_samples = 0
        self.role: ServerRole = self._new_role()
        self._why_handshake = _FIRST_START

    # -- the turn -----------------------------------------------------------------------

    def run(self) -> ServerOutcome:
        """Serve the turn until it completes, is paused or is stopped.

        Raises:
            HospitalSilent: nothing came from the hospital within ``silence_timeout``.
            FrameRefused: a frame of the hospital failed a check (nothing of it was
                applied); the hospital is told the turn is over (``stopped``).
            TurnFailed: the hospital sent frames that break the protocol, or no common
                point to resume from exists; the hospital is told as above.
            ChannelError: the relay failed.
            CheckpointError: a checkpoint could not be read.
        """
        try:
            if self.reset_streams:
                # Taking over after a failure: stale frames and counters go; a hospital
                # still holding the old place reconnects and says hello again.
                self.channel.reset(self.streams.up)
                self.channel.reset(self.streams.down)
            if len(self.store.steps()) > 1:  # checkpoints of an earlier run are there
                self._why_handshake = "a new run of the server"
            self._handshake()
            while True:
                frame = self._next_frame(at_boundary=not self._mid_step)
                outcome = self._dispatch(frame)
                if outcome is not None:
                    return outcome
        except _Interrupted as stop:
            return self._interrupted(stop.directive)
        except TurnFailed:
            self._say_stopped()
            raise

    def _say_stopped(self) -> None:
        """Tell the hospital its turn attempt is over, so it need not wait for its reply
        timeout; the relay failing here changes nothing (the failure is the news)."""
        try:
            self._send(control.signal(self.ids, FrameKind.STOPPED, self.next_step))
        except (ChannelError, CodecError) as e:
            logger.warning("%s: could not tell the hospital the turn failed: %s", self._where(), e)

    def _refused(self, rejection: FrameRejected) -> FrameRefused:
        refused = FrameRefused(rejection.sent_by(self.sender))
        logger.warning("%s: %s", self._where(), refused)
        return refused

    def _dispatch(self, frame: Frame) -> ServerOutcome | None:
        kind, step = frame.meta.kind, frame.meta.step
        if kind == FrameKind.REJOIN:
            if self._rejoin_nonce(frame) == control.HELLO:
                logger.info("%s: the hospital came back; starting a new handshake", self._where())
                self._why_handshake = "the hospital came back"
                # The weights hold every step before next_step (a step's update comes with
                # its last exchange): keep them, so a hospital that stopped cleanly there
                # need not go back further.
                self._checkpoint()
                self._handshake()
            else:
                self._drop(frame, "an answer to a handshake already done")
            return None
        if kind in _TRAINING_KINDS and not self.training_done:
            if step == self.next_step:
                self._train(frame)
            elif step == self.next_step - 1 and self._answered:
                self._answer_again(frame)
            else:
                self._drop(frame, f"step {step} is not the expected step {self.next_step}")
            return None
        if step != self.next_step or self._mid_step:
            self._drop(frame, f"step {step} is not the expected step {self.next_step}")
            return None
        if kind == FrameKind.EVAL_ACTIVATIONS:
            self._send(self._evaluate(frame))
            self.next_step += 1
            return None
        if kind == FrameKind.METRICS:
            try:
                checks.check_metrics_step(frame, self.limits)
                metrics = control.metric_values(frame)
                checks.check_metrics(frame, metrics, self.limits)
            except FrameRejected as e:
                raise self._refused(e) from e
            self._end_training()
            self.hooks.finish(metrics, self.progress)
            self._send(control.signal(self.ids, FrameKind.DONE, step))
            logger.info("%s: turn completed at step %d", self._where(), step)
            return ServerOutcome.COMPLETED
        self._drop(frame, f"a {kind} frame is not expected from a hospital here")
        return None

    # -- the handshake ------------------------------------------------------------------

    def _handshake(self) -> None:
        self.nonce = control.new_nonce()
        self._send(control.sync(self.ids, self.nonce))
        while True:
            frame = self._next_frame(at_boundary=True)
            nonce = self._rejoin_nonce(frame) if frame.meta.kind == FrameKind.REJOIN else None
            if nonce == control.HELLO:
                # A hospital (re)starting, which may have missed the sync: ask again.
                self.nonce = control.new_nonce()
                self._send(control.sync(self.ids, self.nonce))
                continue
            if nonce is None or nonce != self.nonce:
                self._drop(frame, "waiting for the hospital to answer the handshake")
                continue
            try:
                offered = control.snapshot_steps(frame)
            except FrameRejected as e:
                raise self._refused(e) from e
            held = set(self.store.steps())
            common = [s for s in offered if s - 1 in held]
            if not common:
                raise TurnFailed(
                    f"no common point to resume from: {self.sender} holds snapshots before "
                    f"steps {sorted(offered)}, the server checkpoints after steps {sorted(held)}"
                )
            start = max(common)
            self._restore(start)
            self._send(control.resume(self.ids, self.nonce, start, self.checkpoint_every))
            logger.info("%s: resuming at step %d", self._where(), start)
            if start > 0 or self._why_handshake != _FIRST_START:
                self.hooks.resumed(start, self._why_handshake)
            self._why_handshake = _FIRST_START
            return

    def _rejoin_nonce(self, frame: Frame) -> int:
        """A ``rejoin``'s nonce, read only once the frame holds what a rejoin holds."""
        try:
            return control.checked_nonce(frame)
        except FrameRejected as e:
            raise self._refused(e) from e

    def _restore(self, start: int) -> None:
        data = self.store.load(start - 1)
        import_parties(data, {SERVER_PARTY: self.party})
        self.role = self._new_role()
        self.next_step = start
        self.saved_through = start - 1
        self.training_done = False
        self._mid_step = False
        # A fresh role holds no answer to re-send: a frame of step start - 1 now would
        # be computed and applied again, so it is dropped instead.
        self._answered = False
        self.progress.steps = start
        self.progress.samples = start * self.batch_size

    def _new_role(self) -> ServerRole:
        return get_mode(self.ids.mode).server_role(
            self.party,
            self.split,
            job=self.ids.job,
            codec=self.ids.codec,
            loss_fn=self.loss_fn,
            limits=self.limits,
        )

    # -- steps --------------------------------------------------------------------------

    def _train(self, frame: Frame) -> None:
        if self._mid_step and frame.meta.kind == FrameKind.ACTIVATIONS:
            self._answer_again(frame)  # U-shaped: the first exchange of this step, again
            return
        if frame.meta.kind == FrameKind.ACTIVATIONS:
            self._step_samples = _batch_of(frame)
        try:
            # The role checks the frame against its spec and the limits before it applies
            # anything (medsplit.protocol.checks).
            reply = self.role.handle(frame)
        except FrameRejected as e:
            raise self._refused(e) from e
        except (FrameError, ProtocolError) as e:
            raise TurnFailed(
                f"{self.sender}'s frame for step {frame.meta.step} is not valid: {e}"
            ) from e
        self._send(reply)
        self._answered = True
        if reply.meta.kind != FrameKind.GRADIENTS:  # U-shaped: the step's first exchange
            self._mid_step = True
            return
        self._mid_step = False
        self.next_step += 1
        self.progress.steps = self.next_step
        self.progress.samples += self._step_samples
        if LOSS in reply.tensors:
            self.progress.loss = float(reply.tensors[LOSS])
        self.hooks.progress(self.progress)
        if self.next_step % self.checkpoint_every == 0:
            self._checkpoint()

    def _answer_again(self, frame: Frame) -> None:
        """The hospital sent the latest step again (it lost the answer): same answer."""
        try:
            reply = self.role.handle(frame)
        except ProtocolError as e:
            self._drop(frame, str(e))
            return
        self._send(reply)

    def _evaluate(self, frame: Frame) -> Frame:
        """Checks a validation batch, ends training (the first one), runs the segment on
        it in eval mode, learning nothing, and checks what came out."""
        spec = FrameSpec(
            kind=FrameKind.EVAL_ACTIVATIONS, tensors=boundary_spec(self.split.boundaries[0])
        )
        try:
            index = checks.check_eval_step(frame, self.limits)
            checks.conforms(frame, spec)
            checks.check_eval_batch(frame, checks.batch_of(frame), self.limits, index)
            checks.check_finite(frame)
        except FrameRejected as e:
            raise self._refused(e) from e
        self._end_training()
        module = self.party.module
        with eval_mode([module]), torch.no_grad():
            out = module(**dict(frame.tensors))
        tensors = dict(out) if isinstance(out, Mapping) else {LOGITS: out}
        try:
            checks.check_computed(frame, {f"output {n!r}": t for n, t in tensors.items()})
        except FrameRejected as e:
            raise self._refused(e) from e
        return self.ids.frame(FrameKind.EVAL_OUTPUTS, frame.meta.step, tensors)

    def _end_training(self) -> None:
        if not self.training_done:
            self.training_done = True
            self._checkpoint()

    def _checkpoint(self) -> None:
        last = self.next_step - 1
        if last == BASE or self.saved_through == last:
            return
        self.store.save(last, export_parties({SERVER_PARTY: self.party}))
        self.saved_through = last
        self.progress.checkpoints.append(last)

    def _interrupted(self, directive: Directive) -> ServerOutcome:
        if directive == Directive.PAUSE:
            self._checkpoint()
            self._send(control.signal(self.ids, FrameKind.PAUSED, self.next_step))
            logger.info("%s: paused before step %d", self._where(), self.next_step)
            return ServerOutcome.PAUSED
        self._send(control.signal(self.ids, FrameKind.STOPPED, self.next_step))
        logger.info("%s: stopped before step %d", self._where(), self.next_step)
        return ServerOutcome.STOPPED

    # -- frames -------------------------------------------------------------------------

    def _next_frame(self, *, at_boundary: bool) -> Frame:
        """The next frame of this turn from the hospital; frames of other turns are dropped."""
        silent_since = time.monotonic()
        relay_error = ""
        while True:
            if at_boundary:
                directive = self.hooks.directive()
                if directive != Directive.RUN:
                    raise _Interrupted(directive)
            waited = time.monotonic() - silent_since
            if waited >= self.silence_timeout:
                raise HospitalSilent(
                    f"{self.sender} sent nothing for {waited:.1f} s "
                    f"(silence timeout {self.silence_timeout:g} s){relay_error}"
                )
            wait = min(self.poll_interval, self.silence_timeout - waited)
            try:
                payload = self.channel.receive(self.streams.up, timeout=max(wait, 0.01))
            except ChannelTimeout:
                continue
            except RelayAbuse as e:
                # The hospital's doing, not the relay's: no waiting for a hello here.
                raise RelayOverused(f"{self.sender} put too much on the relay: {e}") from e
            except ChannelError as e:
                # Redis away, or frames lost on the stream: the hospital's next hello (or
                # the silence timeout) decides; the loss itself is logged, never ignored.
                logger.warning("%s: relay: %s", self._where(), e)
                relay_error = f"; last relay error: {e}"
                time.sleep(min(self.poll_interval, 1.0))
                continue
            self.progress.bytes_up += len(payload)
            try:
                frame = decode_frame(payload, max_bytes=self.max_frame_bytes)
            except FrameError as e:
                rejection = FrameRejected(checks.WELL_FORMED, f"bytes that are not a frame: {e}")
                raise self._refused(rejection) from e
            if self.ids.owns(frame):
                self.progress.saw("up", frame)
                return frame
            self._drop(frame, "it belongs to another turn")
            silent_since = time.monotonic()

    def _send(self, frame: Frame) -> None:
        payload = encode_frame(frame, max_bytes=self.max_frame_bytes)
        self.channel.send(self.streams.down, payload)
        self.progress.saw("down", frame)
        self.progress.bytes_down += len(payload)

    def _drop(self, frame: Frame, why: str) -> None:
        m = frame.meta
        logger.info(
            "%s: dropped a %s frame (round %d, turn %d, step %d): %s",
            self._where(),
            m.kind,
            m.round,
            m.turn,
            m.step,
            why,
        )

    def _where(self) -> str:
        return f"job {self.ids.job} round {self.ids.round} turn {self.ids.position}"


def _batch_of(frame: Frame) -> int:
    first = next((t for t in frame.tensors.values() if t.dim() > 0), None)
    return int(first.shape[0]) if first is not None else 0
