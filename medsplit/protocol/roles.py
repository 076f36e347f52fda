"""What every mode's client and server do, and the step they do it in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from medsplit.cutting import BoundaryTensor
from medsplit.errors import ProtocolError
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.party import Party
from medsplit.wire import Frame, FrameKind, FrameMeta, FrameSpec, TensorSpec

# Names of the tensors a frame carries besides the crossing ones.
LABELS = "labels"
LOSS = "loss"
LOGITS = "logits"

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, order=True)
class StepIds:
    """Where a step stands in its job; frames of one step all carry these numbers
    (``position`` is the hospital's place in its round)."""

    job: str
    round: int
    position: int
    step: int

    def meta(self, kind: FrameKind, mode: str, codec: str) -> FrameMeta:
        return FrameMeta(
            job=self.job,
            round=self.round,
            position=self.position,
            step=self.step,
            kind=kind,
            mode=mode,
            codec=codec,
        )

    @classmethod
    def of(cls, frame: Frame) -> StepIds:
        m = frame.meta
        return cls(m.job, m.round, m.position, m.step)

    @property
    def order(self) -> tuple[int, int, int]:
        """(round, position, step): steps of a job compare in this order."""
        return (self.round, self.position, self.step)


@dataclass(frozen=True)
class StepResult:
    """What one finished training step reports to the hospital that ran it."""

    ids: StepIds
    loss: float
    samples: int
    bytes_up: int = 0
    bytes_down: int = 0


class ClientRole(ABC):
    """The hospital's side of one mode: starts each step and reacts to the server's frames.

    ``mode`` is the name of the mode that built the role (given by its ``client_role``
    hook), written into every frame it sends: a mode reusing another's roles under its
    own name passes its name, and need not subclass them.
    """

    mode: str

    @abstractmethod
    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor) -> Frame:
        """Run the local layers on a batch and return the first frame to send up."""

    @abstractmethod
    def receive(self, frame: Frame) -> Frame | StepResult:
        """Take a frame from the server: return the next frame to send, or the finished step."""

    @abstractmethod
    def expect(self) -> FrameSpec:
        """What the next frame from the server must look like (checked while decoding)."""


class ServerRole(ABC):
    """The server's side of one mode: answers each frame from a hospital with one frame.

    ``mode`` is the name of the mode that built the role, as for :class:`ClientRole`.
    """

    mode: str

    @abstractmethod
    def handle(self, frame: Frame) -> Frame:
        """Compute on a frame from the hospital and return the answer to send down."""

    @abstractmethod
    def expect(self) -> FrameSpec:
        """What the next frame from the hospital must look like (checked while decoding)."""


def boundary_spec(boundary: tuple[BoundaryTensor, ...]) -> dict[str, TensorSpec]:
    """Tensor specs of a cut's crossing tensors, any batch size."""
    return {t.name: TensorSpec((None, *t.shape), t.dtype) for t in boundary}


def gradient_spec(boundary: tuple[BoundaryTensor, ...]) -> dict[str, TensorSpec]:
    """Specs of the gradients that may come back for a cut's floating-point tensors."""
    return {
        t.name: TensorSpec((None, *t.shape), t.dtype) for t in boundary if t.dtype.is_floating_point
    }


def as_leaves(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Received tensors as fresh autograd leaves, so their gradients can be sent back."""
    return {
        name: t.detach().requires_grad_(t.dtype.is_floating_point) for name, t in tensors.items()
    }


def gradients_of(leaves: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gradients that reached the leaves; tensors no gradient reached are left out.

    Sending zeros instead would turn a ``None`` gradient upstream into a zero one, and
    optimizers treat those differently (weight decay and momentum still apply).
    """
    return {name: t.grad for name, t in leaves.items() if t.grad is not None}


def backward_into(outputs: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
    """Continue backpropagation from ``outputs`` with the gradients received for them.

    An output with no gradient history here (a mask, say) is skipped: the other side
    cannot tell, and computes a gradient for it that leads nowhere.
    """
    names = [n for n in outputs if n in grads and outputs[n].requires_grad]
    if names:
        torch.autograd.backward([outputs[n] for n in names], [grads[n] for n in names])


class Rollback:
    """Buffers (batch-norm statistics) of some parties as they were before a step's
    forward, to put back, with no gradients left behind, if the step is refused.

    Checks of a frame come before any forward, but a check of what was computed from it
    (its loss overflowed, say) comes after one, which has updated running statistics.
    """

    def __init__(self, *parties: Party) -> None:
        self.parties = parties
        self._saved = [(b, b.detach().clone()) for p in parties for b in p.module.buffers()]

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in self._saved:
                buffer.copy_(saved)
        for party in self.parties:
            party.optimizer.zero_grad(set_to_none=True)


@contextmanager
def eval_mode(segments: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Put ``segments`` in eval mode and restore every module's own flag afterwards."""
    modules = [m for segment in segments for m in segment.modules()]
    flags = {m: m.training for m in modules}
    for segment in segments:
        segment.eval()
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


@contextmanager
def refused_undone(rollback: Rollback | None) -> Iterator[None]:
    """Put ``rollback``'s parties back as they were if a check refuses the step."""
    try:
        yield
    except FrameRejected:
        if rollback is not None:
            rollback.restore()
        raise


class AppliedSteps:
    """Keeps a step from being applied twice, and answers a re-sent frame of the latest step.

    A hospital that lost the server's answer (a dropped connection, a restart) sends the
    same frame again; the server answers with what it already computed instead of
    computing (and applying) it a second time. A frame of an older step, or the latest
    step's frame with different contents, is refused.
    """

    def __init__(self, job: str) -> None:
        self.job = job
        self.last: StepIds | None = None
        self._answers: dict[FrameKind, tuple[Frame, Frame]] = {}

    def answer_again(self, frame: Frame, *, who: str) -> Frame | None:
        """The answer already sent if ``frame`` re-sends the latest step, else ``None``.

        Raises:
            ProtocolError: another job's frame, a step before the latest, or a re-sent
                frame whose tensors differ from the first.
        """
        ids = StepIds.of(frame)
        if ids.job != self.job:
            raise ProtocolError(f"{who} serves job {self.job!r}, got a frame for job {ids.job!r}")
        if self.last is None or ids.order > self.last.order:
            return None
        answered = self._answers.get(frame.meta.kind) if ids == self.last else None
        if answered is None and ids == self.last:
            return None  # the next exchange of the latest step (U-shaped has two)
        if answered is None:
            raise ProtocolError(
                f"{who} already applied step {self.last.order}; a {frame.meta.kind} frame "
                f"for step {ids.order} comes too late (an out-of-order frame)"
            )
        request, reply = answered
        if not _same_tensors(request, frame):
            raise ProtocolError(
                f"{who} got step {ids.order} again with different contents; a step is computed once"
            )
        return reply

    def record(self, request: Frame, reply: Frame) -> None:
        """Remember the answer to ``request`` (the latest step's frames only)."""
        ids = StepIds.of(request)
        if ids != self.last:
            self.last = ids
            self._answers = {}
        self._answers[request.meta.kind] = (request, reply)


def _same_tensors(a: Frame, b: Frame) -> bool:
    return a.tensors.keys() == b.tensors.keys() and all(
        a.tensors[k].dtype == b.tensors[k].dtype
        and a.tensors[k].shape == b.tensors[k].shape
        and torch.equal(a.tensors[k], b.tensors[k])
        for k in a.tensors
    )


class PendingStep:
    """The one step a party has in flight, and the checks that a frame belongs to it."""

    def __init__(self) -> None:
        self.ids: StepIds | None = None

    def begin(self, ids: StepIds, *, who: str) -> None:
        if self.ids is not None:
            raise ProtocolError(
                f"{who} cannot start step {ids.order}: step {self.ids.order} is still in flight"
            )
        self.ids = ids

    def check(self, frame: Frame, kind: FrameKind, *, who: str) -> StepIds:
        ids = StepIds.of(frame)
        if self.ids is None:
            raise ProtocolError(f"{who} got a {frame.meta.kind} frame but has no step in flight")
        if frame.meta.kind != kind:
            raise ProtocolError(f"{who} expected a {kind} frame, got {frame.meta.kind}")
        if ids != self.ids:
            raise ProtocolError(
                f"{who} got a frame for {ids}, but the step in flight is {self.ids}"
            )
        return ids

    def end(self) -> None:
        self.ids = None
