"""The server's side of one turn over a relay: handshake, steps, checkpoints, validation.

:class:`TurnServer` runs one hospital's turn from wherever the last checkpoint left it.
It knows nothing of databases or task queues: the caller (a Celery task in ``workers/``)
gives it a :class:`~medsplit.turns.stores.StateStore` and :class:`TurnHooks`
that record progress, say whether to pause or stop, and record the turn's end. Its
states and their transitions are :data:`~medsplit.turns.states.SERVER_TRANSITIONS`; its
frames go through a :class:`~medsplit.turns.frameio.FrameIO`; the steps are the mode's
server role's, validation the mode's :meth:`~medsplit.modes.SplitMode.eval_outputs`, and
when to checkpoint a :class:`~medsplit.turns.checkpoints.CheckpointPolicy`.

Layout of a turn's steps on the wire: ``0 .. T-1`` train (the mode's exchanges), then
``T .. T+V-1`` validate (``eval_activations`` up, ``eval_outputs`` down; nothing is
learnt), then step ``T+V`` carries the hospital's ``metrics``, answered by ``done``.
The server learns ``T`` when the first validation (or metrics) frame arrives.

Checkpoints: after answering step ``s - 1`` when ``s`` is a multiple of
``checkpoint_every``, at the end of training, when paused and before a new handshake
mid-turn (:class:`~medsplit.turns.checkpoints.CheckpointPolicy`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.errors import (
    ChannelError,
    CodecError,
    FrameError,
    MedSplitError,
    ProtocolError,
    RelayAbuse,
)
from medsplit.modes import SplitMode, get_mode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LOSS, LossFn, ServerRole
from medsplit.turns import control
from medsplit.turns.checkpoints import BASE, CheckpointPolicy
from medsplit.turns.frameio import FrameIO
from medsplit.turns.states import SERVER_TRANSITIONS, ServerState, TurnState
from medsplit.turns.stores import StateStore
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind

logger = logging.getLogger(__name__)

SERVER_PARTY = "server"


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


class StepGate(Protocol):
    """Where several turns train one shared server segment at once (SFLV2, one task):
    what lets this turn's step run, in the group's order (:mod:`medsplit.turns.shared`).
    Its methods raise :class:`TurnFailed` once the group failed."""

    def restoring(self, position: int, start: int) -> AbstractContextManager[None]:
        """Held while this turn loads the shared segment's state to start from; refuses
        once any step of the group ran (the segment cannot go back for one hospital)."""
        ...

    def acquire(self, position: int, step: int) -> None:
        """Wait until ``step`` of this turn is the group's next, and hold the segment."""
        ...

    def release(self, position: int, step: int) -> None:
        """``step`` of this turn is applied: the next in the group's order may run."""
        ...

    def evaluating(self) -> AbstractContextManager[None]:
        """Held while this turn validates: once every training step of the group ran, one
        turn at a time (validation must see the trained segment, and never another
        turn's step half done)."""
        ...


class _Interrupted(Exception):
    def __init__(self, directive: Directive) -> None:
        self.directive = directive


class ServerCheckpoints:
    """The server segment's checkpoints in one turn: where they live, when they are due,
    and which step the saved weights hold (so that nothing is saved twice)."""

    def __init__(
        self, store: StateStore, party: Party, policy: CheckpointPolicy, progress: TurnProgress
    ) -> None:
        self.store = store
        self.party = party
        self.policy = policy
        self.progress = progress
        self.saved_through: int | None = None  # the checkpoint the weights equal, if any

    def earlier_run(self) -> bool:
        """Whether checkpoints of an earlier run of this turn are held."""
        return len(self.store.steps()) > 1

    def save(self, last: int) -> None:
        """Keep the weights as "after step ``last``" (nothing to do for the start, or when
        that one is saved already)."""
        if last == BASE or self.saved_through == last:
            return
        self.store.save(last, export_parties({SERVER_PARTY: self.party}))
        self.saved_through = last
        self.progress.checkpoints.append(last)

    def restore(self, start: int) -> None:
        """The weights (and optimizer) as they were after step ``start - 1``."""
        import_parties(self.store.load(start - 1), {SERVER_PARTY: self.party})
        self.saved_through = start - 1


#: The hospital's frames the server acts on, each with the states it takes it in; any
#: other (kind, state) pair is dropped, logged and counted.
_TAKES: Mapping[FrameKind, frozenset[ServerState]] = {
    FrameKind.REJOIN: frozenset(ServerState),
    FrameKind.ACTIVATIONS: frozenset({ServerState.TRAINING, ServerState.MID_STEP}),
    FrameKind.HEAD_GRADIENTS: frozenset({ServerState.TRAINING, ServerState.MID_STEP}),
    FrameKind.EVAL_ACTIVATIONS: frozenset({ServerState.TRAINING, ServerState.VALIDATING}),
    FrameKind.METRICS: frozenset({ServerState.TRAINING, ServerState.VALIDATING}),
}


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
        initial: counters carried over from an earlier run of the same turn (updated in
            place).
        reset_streams: start both streams afresh (a run taking the turn over after a
            failure, when stale frames or counters may be left on them).
        gate: where several turns share ``party`` in one task (SFLV2), what orders their
            steps (:class:`StepGate`); ``None``: this turn has the segment to itself.
        mode: the job's mode bound to its options (``TrainingConfig.split_mode``: where
            SplitFed's labels are changes its roles); default: ``ids.mode`` as registered.
        role: builds this turn's server role afresh (at the start and on every resume);
            default: the mode's :meth:`~medsplit.modes.SplitMode.server_role` on
            ``party``. A vertical round gives each party's turn a role of its joint step
            (:mod:`medsplit.turns.joint`).

    What changes while it runs: :attr:`turn_state`, :attr:`next_step`, :attr:`nonce`,
    :attr:`role`, :attr:`progress` and the checkpoints' ``saved_through``; the rest is
    set once.
    """

    def __init__(
        self,
        *,
        ids: control.TurnIds,
        channel: Channel,
        streams: StreamPair,
        split: SplitModel,
        party: Party,
        store: StateStore,
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
        gate: StepGate | None = None,
        mode: SplitMode | None = None,
        role: Callable[[], ServerRole] | None = None,
    ) -> None:
        policy = CheckpointPolicy(checkpoint_every)
        if mode is not None and mode.name != ids.mode:
            raise ValueError(f"the turn is in mode {ids.mode!r}, not {mode.name!r}")
        if limits is None:
            if batch_size is None:
                raise ValueError("give the turn's limits (or at least its batch_size)")
            limits = FrameLimits(batch_size=batch_size)
        elif batch_size is not None and batch_size != limits.batch_size:
            raise ValueError(f"batch_size {batch_size} differs from the limits' {limits}")
        self.ids = ids
        self.mode: SplitMode = mode or get_mode(ids.mode)
        self.split = split
        self.party = party
        self.hooks = hooks
        self.limits = limits
        #: Who sends this turn's frames, as the reasons a turn fails with name it.
        self.sender = f"hospital {hospital}" if hospital else "the hospital"
        self.silence_timeout = silence_timeout
        self.poll_interval = poll_interval
        self.loss_fn = loss_fn
        self.reset_streams = reset_streams
        self.gate = gate
        self._role_factory = role
        self.channel = channel
        self.streams = streams
        self.progress = initial or TurnProgress()
        self.io = FrameIO(
            channel,
            inbound=streams.up,
            outbound=streams.down,
            ids=ids,
            max_frame_bytes=max_frame_bytes,
            where=self._where(),
        )
        self._bytes_before = (self.progress.bytes_up, self.progress.bytes_down)
        self.checkpoints = ServerCheckpoints(store, party, policy, self.progress)
        self.turn_state = TurnState(SERVER_TRANSITIONS, ServerState.STARTING, side="server")
        self.next_step = 0
        self.nonce = 0
        self._answered = False  # the role holds the answer to step next_step - 1
        self._step_samples = 0
        self._why_handshake = _FIRST_START
        self.role: ServerRole = self._new_role()
        self._handlers: Mapping[FrameKind, Callable[[Frame], ServerOutcome | None]] = {
            FrameKind.REJOIN: self._on_rejoin,
            FrameKind.ACTIVATIONS: self._on_training,
            FrameKind.HEAD_GRADIENTS: self._on_training,
            FrameKind.EVAL_ACTIVATIONS: self._on_eval,
            FrameKind.METRICS: self._on_metrics,
        }

    @property
    def checkpoint_every(self) -> int:
        return self.checkpoints.policy.every

    @property
    def batch_size(self) -> int:
        return self.limits.batch_size

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
            StoreError: a checkpoint could not be read.
        """
        try:
            if self.reset_streams:
                # Taking over after a failure: stale frames and counters go; a hospital
                # still holding the old place reconnects and says hello again.
                self.channel.reset(self.streams.up)
                self.channel.reset(self.streams.down)
            if self.checkpoints.earlier_run():
                self._why_handshake = "a new run of the server"
            self._handshake()
            while True:
                outcome = self._dispatch(self._next_frame())
                if outcome is not None:
                    return outcome
        except _Interrupted as stop:
            return self._interrupted(stop.directive)
        except TurnFailed:
            self.turn_state.to(ServerState.FAILED)
            self._say_stopped()
            raise
        except Exception:
            if not self.turn_state.is_final():  # the relay, the store: the caller decides
                self.turn_state.to(ServerState.FAILED)
            raise

    def _dispatch(self, frame: Frame) -> ServerOutcome | None:
        kind = frame.meta.kind
        if self.turn_state.now not in _TAKES.get(kind, frozenset()):
            why = f"a {kind} frame is not taken in state {self.turn_state.now.value!r}"
            self.io.drop(frame, why)
            return None
        return self._handlers[kind](frame)

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

    # -- the handshake ------------------------------------------------------------------

    def _on_rejoin(self, frame: Frame) -> None:
        if self._rejoin_nonce(frame) != control.HELLO:
            self.io.drop(frame, "an answer to a handshake already done")
            return
        logger.info("%s: the hospital came back; starting a new handshake", self._where())
        self._why_handshake = "the hospital came back"
        # The weights hold every step before next_step (a step's update comes with its
        # last exchange): keep them, so a hospital that stopped cleanly there need not go
        # back further.
        self.checkpoints.save(self.next_step - 1)
        self._handshake()

    def _handshake(self) -> None:
        self.turn_state.to(ServerState.HANDSHAKE)
        self.nonce = control.new_nonce()
        self._send(control.sync(self.ids, self.nonce))
        while True:
            frame = self._next_frame()
            nonce = self._rejoin_nonce(frame) if frame.meta.kind == FrameKind.REJOIN else None
            if nonce == control.HELLO:
                # A hospital (re)starting, which may have missed the sync: ask again.
                self.nonce = control.new_nonce()
                self._send(control.sync(self.ids, self.nonce))
                continue
            if nonce is None or nonce != self.nonce:
                self.io.drop(frame, "waiting for the hospital to answer the handshake")
                continue
            try:
                offered = control.snapshot_steps(frame)
            except FrameRejected as e:
                raise self._refused(e) from e
            held = set(self.checkpoints.store.steps())
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
        with self.gate.restoring(self.ids.position, start) if self.gate else nullcontext():
            self.checkpoints.restore(start)
        self.role = self._new_role()
        self.next_step = start
        self.turn_state.to(ServerState.TRAINING)
        # A fresh role holds no answer to re-send: a frame of step start - 1 now would
        # be computed and applied again, so it is dropped instead.
        self._answered = False
        self.progress.steps = start
        self.progress.samples = start * self.batch_size

    def _new_role(self) -> ServerRole:
        if self._role_factory is not None:
            return self._role_factory()
        return self.mode.server_role(
            self.party,
            self.split,
            job=self.ids.job,
            codec=self.ids.codec,
            loss_fn=self.loss_fn,
            limits=self.limits,
        )

    # -- steps --------------------------------------------------------------------------

    def _on_training(self, frame: Frame) -> None:
        step = frame.meta.step
        if step == self.next_step:
            self._train(frame)
        elif step == self.next_step - 1 and self._answered:
            self._answer_again(frame)
        else:
            self.io.drop(frame, f"step {step} is not the expected step {self.next_step}")

    def _train(self, frame: Frame) -> None:
        mid_step = self.turn_state.now == ServerState.MID_STEP
        if mid_step and frame.meta.kind == FrameKind.ACTIVATIONS:
            self._answer_again(frame)  # U-shaped: the first exchange of this step, again
            return
        if frame.meta.kind == FrameKind.ACTIVATIONS:
            self._step_samples = _batch_of(frame)
            if self.gate is not None:  # the shared segment's next step must be this one
                self.gate.acquire(self.ids.position, frame.meta.step)
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
            self.turn_state.to(ServerState.MID_STEP)
            return
        self.turn_state.to(ServerState.TRAINING)
        if self.gate is not None:
            self.gate.release(self.ids.position, frame.meta.step)
        self.next_step += 1
        self.progress.steps = self.next_step
        self.progress.samples += self._step_samples
        if LOSS in reply.tensors:
            self.progress.loss = float(reply.tensors[LOSS])
        self.hooks.progress(self.progress)
        if self.checkpoints.policy.due(self.next_step):
            self.checkpoints.save(self.next_step - 1)

    def _answer_again(self, frame: Frame) -> None:
        """The hospital sent the latest step again (it lost the answer): same answer."""
        try:
            reply = self.role.handle(frame)
        except ProtocolError as e:
            self.io.drop(frame, str(e))
            return
        self._send(reply)

    def _at_next_step(self, frame: Frame) -> bool:
        if frame.meta.step == self.next_step:
            return True
        self.io.drop(frame, f"step {frame.meta.step} is not the expected step {self.next_step}")
        return False

    def _on_eval(self, frame: Frame) -> None:
        """A validation batch: checked, its first one ends training, run through the
        segment in eval mode by the mode (learning nothing), answered."""
        if not self._at_next_step(frame):
            return
        try:
            with self.gate.evaluating() if self.gate else nullcontext():
                tensors = self.mode.eval_outputs(
                    frame, party=self.party, split=self.split, limits=self.limits
                )
        except FrameRejected as e:
            raise self._refused(e) from e
        self._end_training()
        self._send(self.ids.frame(FrameKind.EVAL_OUTPUTS, frame.meta.step, tensors))
        self.next_step += 1

    def _on_metrics(self, frame: Frame) -> ServerOutcome | None:
        if not self._at_next_step(frame):
            return None
        try:
            checks.check_metrics_step(frame, self.limits)
            metrics = control.metric_values(frame)
            checks.check_metrics(frame, metrics, self.limits)
        except FrameRejected as e:
            raise self._refused(e) from e
        self._end_training()
        self.hooks.finish(metrics, self.progress)
        self._send(control.signal(self.ids, FrameKind.DONE, frame.meta.step))
        self.turn_state.to(ServerState.COMPLETED)
        logger.info("%s: turn completed at step %d", self._where(), frame.meta.step)
        return ServerOutcome.COMPLETED

    def _end_training(self) -> None:
        if self.turn_state.now == ServerState.TRAINING:
            self.turn_state.to(ServerState.VALIDATING)
            self.checkpoints.save(self.next_step - 1)

    def _interrupted(self, directive: Directive) -> ServerOutcome:
        if directive == Directive.PAUSE:
            self.checkpoints.save(self.next_step - 1)
            self._send(control.signal(self.ids, FrameKind.PAUSED, self.next_step))
            self.turn_state.to(ServerState.PAUSED)
            logger.info("%s: paused before step %d", self._where(), self.next_step)
            return ServerOutcome.PAUSED
        self._send(control.signal(self.ids, FrameKind.STOPPED, self.next_step))
        self.turn_state.to(ServerState.STOPPED)
        logger.info("%s: stopped before step %d", self._where(), self.next_step)
        return ServerOutcome.STOPPED

    # -- frames -------------------------------------------------------------------------

    def _next_frame(self) -> Frame:
        """The next frame of this turn from the hospital; the directive is asked between
        steps (never in the middle of one)."""
        try:
            frame = self.io.next_frame(
                silence_timeout=self.silence_timeout,
                poll=self.poll_interval,
                interrupted=self._directive,
                silent=self._silent,
                wait_out_relay_errors=True,
            )
        except RelayAbuse as e:
            # The hospital's doing, not the relay's: no waiting for a hello here.
            raise RelayOverused(f"{self.sender} put too much on the relay: {e}") from e
        except FrameRejected as e:
            raise self._refused(e) from e
        finally:
            self.progress.bytes_up = self._bytes_before[0] + self.io.counters.bytes_in
        assert frame is not None  # _directive raises rather than say "interrupted"
        self.progress.saw("up", frame)
        return frame

    def _directive(self) -> bool:
        if self.turn_state.now != ServerState.MID_STEP:
            directive = self.hooks.directive()
            if directive != Directive.RUN:
                raise _Interrupted(directive)
        return False

    def _silent(self, waited: float, relay_error: str) -> HospitalSilent:
        return HospitalSilent(
            f"{self.sender} sent nothing for {waited:.1f} s "
            f"(silence timeout {self.silence_timeout:g} s){relay_error}"
        )

    def _send(self, frame: Frame) -> None:
        self.io.send(frame)
        self.progress.saw("down", frame)
        self.progress.bytes_down = self._bytes_before[1] + self.io.counters.bytes_out

    def _where(self) -> str:
        return f"job {self.ids.job} round {self.ids.round} turn {self.ids.position}"


def _batch_of(frame: Frame) -> int:
    first = next((t for t in frame.tensors.values() if t.dim() > 0), None)
    return int(first.shape[0]) if first is not None else 0
