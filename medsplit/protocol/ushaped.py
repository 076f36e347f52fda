"""U-shaped split learning: labels and the last layers stay at the hospital.

Vepakomma et al., "Split learning for health: distributed deep learning without
sharing raw patient data", 2018. Four tensors cross per step: activations up, the
middle's output down, its gradient up, the gradient at the first cut down.
"""

from __future__ import annotations

import torch

from medsplit.cutting import BoundaryTensor
from medsplit.errors import ProtocolError
from medsplit.modes import Mode
from medsplit.protocol.party import Party
from medsplit.protocol.roles import (
    AppliedSteps,
    ClientRole,
    LossFn,
    PendingStep,
    ServerRole,
    StepIds,
    StepResult,
    as_leaves,
    backward_into,
    boundary_spec,
    check_batch,
    gradient_spec,
    gradients_of,
)
from medsplit.wire import Frame, FrameKind, FrameSpec


class UShapedClient(ClientRole):
    """Runs the front and the head (with the loss) at the hospital; labels never leave.

    Args:
        front: the first segment with its optimizer.
        head: the last segment with its optimizer.
        boundaries: crossing tensors at the first and the second cut.
        loss_fn: loss on (logits, labels); cross-entropy by default.
        codec: wire codec for what this client sends.
    """

    mode = Mode.USHAPED

    def __init__(
        self,
        *,
        front: Party,
        head: Party,
        boundaries: tuple[tuple[BoundaryTensor, ...], tuple[BoundaryTensor, ...]],
        loss_fn: LossFn | None = None,
        codec: str = "none",
    ):
        self.front = front
        self.head = head
        self.boundaries = boundaries
        self.loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
        self.codec = codec
        self._pending = PendingStep()
        self._outputs: dict[str, torch.Tensor] = {}
        self._labels: torch.Tensor | None = None
        self._loss: float | None = None

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor) -> Frame:
        self._pending.begin(ids, who="client")
        self._outputs = self.front.module(x)
        self._labels = y
        self._loss = None
        tensors = {name: t.detach() for name, t in self._outputs.items()}
        return Frame(ids.meta(FrameKind.ACTIVATIONS, self.mode, self.codec), tensors)

    def receive(self, frame: Frame) -> Frame | StepResult:
        if self._loss is None:
            return self._run_head(frame)
        return self._finish(frame)

    def _run_head(self, frame: Frame) -> Frame:
        ids = self._pending.check(frame, FrameKind.HEAD_ACTIVATIONS, who="client")
        assert self._labels is not None
        check_batch(frame, self._labels.shape[0])
        inputs = as_leaves(frame.tensors)
        loss = self.loss_fn(self.head.module(**inputs), self._labels)
        loss.backward()
        self.head.step()
        self._loss = float(loss.detach())
        return Frame(
            ids.meta(FrameKind.HEAD_GRADIENTS, self.mode, self.codec), gradients_of(inputs)
        )

    def _finish(self, frame: Frame) -> StepResult:
        ids = self._pending.check(frame, FrameKind.GRADIENTS, who="client")
        assert self._labels is not None and self._loss is not None
        samples = self._labels.shape[0]
        check_batch(frame, samples)
        backward_into(self._outputs, frame.tensors)
        self.front.step()
        result = StepResult(ids, loss=self._loss, samples=samples)
        self._outputs, self._labels, self._loss = {}, None, None
        self._pending.end()
        return result

    def expect(self) -> FrameSpec:
        if self._loss is None:
            return FrameSpec(
                kind=FrameKind.HEAD_ACTIVATIONS, tensors=boundary_spec(self.boundaries[1])
            )
        specs = gradient_spec(self.boundaries[0])
        return FrameSpec(kind=FrameKind.GRADIENTS, tensors=specs, optional=frozenset(specs))


class UShapedServer(ServerRole):
    """Runs the middle segment: forward on activations, backward on the head's gradient.

    Args:
        middle: the middle segment with its optimizer.
        boundaries: crossing tensors at the first and the second cut.
        job: the job this server serves; frames of other jobs are refused.
        codec: wire codec for what this server sends.
    """

    mode = Mode.USHAPED

    def __init__(
        self,
        *,
        middle: Party,
        boundaries: tuple[tuple[BoundaryTensor, ...], tuple[BoundaryTensor, ...]],
        job: str,
        codec: str = "none",
    ):
        self.middle = middle
        self.boundaries = boundaries
        self.codec = codec
        self.applied = AppliedSteps(job)
        self._pending = PendingStep()
        self._inputs: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, torch.Tensor] = {}
        self._samples = 0

    def handle(self, frame: Frame) -> Frame:
        again = self.applied.answer_again(frame, who="server")
        if again is not None:
            return again
        if frame.meta.kind == FrameKind.ACTIVATIONS:
            return self._forward(frame)
        if frame.meta.kind == FrameKind.HEAD_GRADIENTS:
            return self._backward(frame)
        raise ProtocolError(f"U-shaped server cannot handle a {frame.meta.kind} frame")

    def _forward(self, frame: Frame) -> Frame:
        ids = StepIds.of(frame)
        self._pending.begin(ids, who="server")
        first = next(iter(frame.tensors.values()))
        self._samples = first.shape[0]
        check_batch(frame, self._samples)
        self._inputs = as_leaves(frame.tensors)
        self._outputs = self.middle.module(**self._inputs)
        tensors = {name: t.detach() for name, t in self._outputs.items()}
        reply = Frame(ids.meta(FrameKind.HEAD_ACTIVATIONS, self.mode, self.codec), tensors)
        self.applied.record(frame, reply)
        return reply

    def _backward(self, frame: Frame) -> Frame:
        ids = self._pending.check(frame, FrameKind.HEAD_GRADIENTS, who="server")
        check_batch(frame, self._samples)
        backward_into(self._outputs, frame.tensors)
        grads = gradients_of(self._inputs)
        self.middle.step()
        self._inputs, self._outputs = {}, {}
        self._pending.end()
        reply = Frame(ids.meta(FrameKind.GRADIENTS, self.mode, self.codec), grads)
        self.applied.record(frame, reply)
        return reply

    def expect(self) -> FrameSpec:
        if self._pending.ids is None:
            return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=boundary_spec(self.boundaries[0]))
        specs = gradient_spec(self.boundaries[1])
        return FrameSpec(kind=FrameKind.HEAD_GRADIENTS, tensors=specs, optional=frozenset(specs))
