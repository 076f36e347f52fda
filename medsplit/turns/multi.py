"""The server side of several hospitals' streams in one task, on one server segment.

SplitFed trains one shared server segment on every hospital's activations; vertical split
learning computes a step only once every party's frame of it is in. Both need a server
that reads several stream pairs at once: :class:`StreamSet` reads N hospitals' streams
(each through its own :class:`~medsplit.turns.frameio.FrameIO`, over one channel or
several), and :class:`MultiStreamServer` serves their training steps on one
:class:`~medsplit.protocol.party.Party`, each stream with its own server role (its own
record of applied steps) from the job's mode, under a :class:`StepPolicy`:

- ``each``: serve whichever stream has a frame, looking at the streams in an order drawn
  afresh for every cycle from a seed; a stream's step is finished before another one's
  starts (a U-shaped step has two exchanges, and one segment cannot hold two backward
  passes at once).
- ``all``: wait for one frame of the step from every stream still training, then compute
  their steps one after another in the seeded order of that step, so that the result
  does not depend on which frame came first.

:attr:`MultiStreamReport.served` lists the steps in the order they were applied: the
same steps, applied in that order one by one, give the same weights bit for bit.

It serves training steps only: each stream's handshake, checkpoints, validation and
metrics stay :class:`~medsplit.turns.server.TurnServer`'s, and the coordinator's
scheduler does not start one yet (see ``docs/design.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.errors import FrameError, ProtocolError
from medsplit.modes import get_mode
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn, ServerRole
from medsplit.turns.control import TurnIds
from medsplit.turns.frameio import FrameCounters, FrameIO
from medsplit.turns.server import FrameRefused, HospitalSilent, TurnFailed
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind

logger = logging.getLogger(__name__)

_STEP_KINDS = frozenset({FrameKind.ACTIVATIONS, FrameKind.HEAD_GRADIENTS})


class StepPolicy(StrEnum):
    EACH = "each"  # whichever stream has a frame, in a seeded order per cycle
    ALL = "all"  # one frame from every stream, then their steps in a seeded order


@dataclass(frozen=True)
class HospitalStream:
    """One hospital's part in a multi-stream task.

    Attributes:
        ids: its turn's ids (job, round, its position, mode, codec).
        streams: its stream pair.
        steps: how many training steps it brings (its ``FrameLimits.train_steps``).
        hospital: its name, as refusals and silences name it.
    """

    ids: TurnIds
    streams: StreamPair
    steps: int
    hospital: str = ""

    @property
    def sender(self) -> str:
        return f"hospital {self.hospital}" if self.hospital else f"position {self.ids.position}"


class StreamSet:
    """Several hospitals' stream pairs, read as one (see the module docstring).

    Args:
        channel: the relay; or one channel per stream.
        streams: the hospitals' streams, in a fixed order (their index is their name here).
        seed: where the order of each cycle is drawn from.
    """

    def __init__(
        self,
        channel: Channel | Sequence[Channel],
        streams: Sequence[HospitalStream],
        *,
        seed: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if not streams:
            raise ValueError("a stream set needs at least one stream")
        channels = [channel] * len(streams) if isinstance(channel, Channel) else list(channel)
        if len(channels) != len(streams):
            raise ValueError(f"{len(channels)} channels for {len(streams)} streams")
        self.streams = tuple(streams)
        self.seed = seed
        self.ios = tuple(
            FrameIO(
                ch,
                inbound=s.streams.up,
                outbound=s.streams.down,
                ids=s.ids,
                max_frame_bytes=max_frame_bytes,
                where=f"job {s.ids.job} round {s.ids.round} {s.sender}",
            )
            for ch, s in zip(channels, streams, strict=True)
        )

    def __len__(self) -> int:
        return len(self.streams)

    def order(self, cycle: int) -> list[int]:
        """The streams' order in ``cycle``: a permutation drawn from (seed, cycle) only."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + cycle)
        return torch.randperm(len(self.streams), generator=generator).tolist()

    def receive(self, index: int, timeout: float) -> Frame | None:
        """Stream ``index``'s next frame of its turn within ``timeout``, or ``None``.

        Raises:
            FrameRefused: bytes that are not a frame, naming the stream's hospital.
        """
        try:
            return self.ios[index].receive(timeout)
        except FrameRejected as e:
            raise FrameRefused(e.sent_by(self.streams[index].sender)) from e

    def send(self, index: int, frame: Frame) -> None:
        self.ios[index].send(frame)

    def drop(self, index: int, frame: Frame, why: str) -> None:
        self.ios[index].drop(frame, why)

    def counters(self) -> list[FrameCounters]:
        return [io.counters for io in self.ios]


@dataclass
class MultiStreamReport:
    """What a multi-stream task served.

    Attributes:
        steps: training steps applied, per stream.
        served: ``(stream index, step)`` in the order the steps were applied.
        counters: each stream's frames and bytes.
    """

    steps: list[int]
    served: list[tuple[int, int]] = field(default_factory=list)
    counters: list[FrameCounters] = field(default_factory=list)


class MultiStreamServer:
    """Serves the training steps of several hospitals' streams on one server segment.

    Args:
        streams: the hospitals' streams (:class:`StreamSet`).
        split: the job's split model.
        party: the one server segment every stream's steps train, with its optimizer.
        policy: :attr:`StepPolicy.EACH` or :attr:`StepPolicy.ALL`.
        limits: what each stream's frames may hold (one per stream, or one for all).
        silence_timeout: seconds without a frame from the streams waited for before the
            task fails, naming them.
        poll_interval: longest wait on one stream before looking at the next
            (``each``), and between two looks at ``interrupted``.
        interrupted: asked between steps; when it says so, the task returns what it served.
    """

    def __init__(
        self,
        streams: StreamSet,
        *,
        split: SplitModel,
        party: Party,
        policy: StepPolicy | str = StepPolicy.EACH,
        limits: FrameLimits | Sequence[FrameLimits | None] | None = None,
        loss_fn: LossFn | None = None,
        silence_timeout: float = 120.0,
        poll_interval: float = 0.05,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        self.streams = streams
        self.policy = StepPolicy(policy)
        self.party = party
        self.silence_timeout = silence_timeout
        self.poll_interval = poll_interval
        self.interrupted = interrupted or (lambda: False)
        per_stream = (
            list(limits) if isinstance(limits, Sequence) else [limits] * len(streams.streams)
        )
        self.roles: tuple[ServerRole, ...] = tuple(
            get_mode(s.ids.mode).server_role(
                party, split, job=s.ids.job, codec=s.ids.codec, loss_fn=loss_fn, limits=lim
            )
            for s, lim in zip(streams.streams, per_stream, strict=True)
        )
        self.report = MultiStreamReport(steps=[0] * len(streams))

    def run(self) -> MultiStreamReport:
        """Serve every stream's training steps (or until ``interrupted``).

        Raises:
            HospitalSilent: the streams waited for sent nothing within the timeout.
            FrameRefused: a frame failed a check; nothing of it was applied.
            TurnFailed: a frame broke the protocol.
            ChannelError: the relay failed.
        """
        serve = self._run_each if self.policy == StepPolicy.EACH else self._run_all
        serve()
        self.report.counters = self.streams.counters()
        return self.report

    def _open(self) -> list[int]:
        return [i for i, s in enumerate(self.streams.streams) if self.report.steps[i] < s.steps]

    def _run_each(self) -> None:
        cycle = 0
        quiet = 0.0
        while (open_ := self._open()) and not self.interrupted():
            served = False
            for index in self.streams.order(cycle):
                if index not in open_:
                    continue
                frame = self.streams.receive(index, self.poll_interval / len(open_))
                if frame is not None and self._starts_step(index, frame):
                    self._step(index, frame)
                    served = True
            cycle += 1
            quiet = 0.0 if served else quiet + self.poll_interval
            if quiet >= self.silence_timeout:
                raise self._silent(open_)

    def _run_all(self) -> None:
        cycle = 0
        while (open_ := self._open()) and not self.interrupted():
            frames = {index: self._wait(index, self._starts_step) for index in open_}
            for index in self.streams.order(cycle):
                if index in frames:
                    self._step(index, frames[index])
            cycle += 1

    def _starts_step(self, index: int, frame: Frame) -> bool:
        """Whether ``frame`` begins stream ``index``'s next step (else it is dropped)."""
        expected = self.report.steps[index]
        if frame.meta.kind == FrameKind.ACTIVATIONS and frame.meta.step == expected:
            return True
        self.streams.drop(index, frame, f"not the activations of step {expected}")
        return False

    def _step(self, index: int, frame: Frame) -> None:
        """One whole step of stream ``index``, from its first frame to its gradients."""
        step = frame.meta.step
        while True:
            reply = self._handle(index, frame)
            self.streams.send(index, reply)
            if reply.meta.kind == FrameKind.GRADIENTS:
                break
            frame = self._wait(index, lambda i, f: self._continues(i, f, step))
        self.report.steps[index] += 1
        self.report.served.append((index, step))

    def _continues(self, index: int, frame: Frame, step: int) -> bool:
        if frame.meta.kind in _STEP_KINDS and frame.meta.step == step:
            return True
        self.streams.drop(index, frame, f"step {step} is in flight")
        return False

    def _handle(self, index: int, frame: Frame) -> Frame:
        try:
            return self.roles[index].handle(frame)
        except FrameRejected as e:
            raise FrameRefused(e.sent_by(self.streams.streams[index].sender)) from e
        except (FrameError, ProtocolError) as e:
            sender = self.streams.streams[index].sender
            raise TurnFailed(
                f"{sender}'s frame for step {frame.meta.step} is not valid: {e}"
            ) from e

    def _wait(self, index: int, takes: Callable[[int, Frame], bool]) -> Frame:
        """Stream ``index``'s next frame that ``takes`` accepts, within the silence."""
        io = self.streams.ios[index]
        io.listen()
        while io.silent_for() < self.silence_timeout:
            frame = self.streams.receive(index, self.poll_interval)
            if frame is not None and takes(index, frame):
                return frame
        raise self._silent([index])

    def _silent(self, waited_for: Sequence[int]) -> HospitalSilent:
        who = ", ".join(self.streams.streams[i].sender for i in waited_for)
        return HospitalSilent(
            f"{who} sent nothing for {self.silence_timeout:g} s (silence timeout) while a "
            f"multi-stream task ({self.policy.value}) waited for them"
        )
