"""U-shaped split learning: labels and the last layers stay at the hospital.

Vepakomma et al., "Split learning for health: distributed deep learning without
sharing raw patient data", 2018. Four tensors cross per step: activations up, the
middle's output down, its gradient up, the gradient at the first cut down.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from medsplit.cutting import BoundaryTensor, SplitModel
from medsplit.errors import ProtocolError
from medsplit.modes.base import Side, SplitMode
from medsplit.protocol.checks import (
    FrameLimits,
    batch_of,
    check_batch,
    check_computed,
    check_finite,
    check_training_batch,
    check_training_step,
    conforms,
)
from medsplit.protocol.party import Party
from medsplit.protocol.roles import (
    AppliedSteps,
    ClientRole,
    LossFn,
    PendingStep,
    Rollback,
    ServerRole,
    StepIds,
    StepResult,
    as_leaves,
    backward_into,
    boundary_spec,
    eval_mode,
    gradient_spec,
    gradients_of,
    refused_undone,
)
from medsplit.wire import Frame, FrameKind, FrameSpec

NAME = "ushaped"


class UShapedMode(SplitMode):
    """Two cuts: the hospital holds the front and the head (with the labels and the
    loss), the server the middle."""

    name = NAME
    title = "U-shaped"
    summary = "the hospital also keeps the last layers and the labels (two cuts)"
    cuts = 2
    labels = Side.HOSPITAL

    def client_segments(self) -> dict[str, int]:
        return {"front": 0, "head": 2}

    def client_role(
        self,
        parties: Mapping[str, Party],
        split: SplitModel,
        *,
        codec: str = "none",
        loss_fn: LossFn | None = None,
    ) -> UShapedClient:
        return UShapedClient(
            front=parties["front"],
            head=parties["head"],
            boundaries=(split.boundaries[0], split.boundaries[1]),
            loss_fn=loss_fn,
            codec=codec,
            mode=self.name,
        )

    def server_role(
        self,
        party: Party,
        split: SplitModel,
        *,
        job: str,
        codec: str = "none",
        loss_fn: LossFn | None = None,
        limits: FrameLimits | None = None,
    ) -> UShapedServer:
        return UShapedServer(
            middle=party,
            boundaries=(split.boundaries[0], split.boundaries[1]),
            job=job,
            codec=codec,
            limits=limits,
            mode=self.name,
        )

    def eval_logits(
        self,
        frame: Frame,
        *,
        parties: Mapping[str, Party],
        split: SplitModel,
        samples: int,
        limits: FrameLimits,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """The middle's outputs at the second cut, checked, through the hospital's head
        (eval mode, no gradients): the labels never left, so neither do the logits."""
        spec = FrameSpec(kind=FrameKind.EVAL_OUTPUTS, tensors=boundary_spec(split.boundaries[1]))
        conforms(frame, spec)
        check_batch(frame, samples)
        check_finite(frame)
        head = parties["head"].module
        inputs = {name: t.to(device) for name, t in frame.tensors.items()}
        with eval_mode([head]), torch.no_grad():
            logits = head(**inputs).cpu()
        check_computed(frame, {"logits": logits})
        return logits


class UShapedClient(ClientRole):
    """Runs the front and the head (with the loss) at the hospital; labels never leave.

    Args:
        front: the first segment with its optimizer.
        head: the last segment with its optimizer.
        boundaries: crossing tensors at the first and the second cut.
        loss_fn: loss on (logits, labels); cross-entropy by default.
        codec: wire codec for what this client sends.
        mode: the name of the mode that built the role, written into its frames.
    """

    def __init__(
        self,
        *,
        front: Party,
        head: Party,
        boundaries: tuple[tuple[BoundaryTensor, ...], tuple[BoundaryTensor, ...]],
        loss_fn: LossFn | None = None,
        codec: str = "none",
        mode: str = NAME,
    ):
        self.mode = mode
        self.front = front
        self.head = head
        self.boundaries = boundaries
        self.loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
        self.codec = codec
        self._pending = PendingStep()
        self._outputs: dict[str, torch.Tensor] = {}
        self._labels: torch.Tensor | None = None
        self._loss: float | None = None
        self._rollback: Rollback | None = None

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor) -> Frame:
        self._pending.begin(ids, who="client")
        self._rollback = Rollback(self.front, self.head)
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
        with refused_undone(self._rollback):
            conforms(frame, self.expect())
            check_batch(frame, self._labels.shape[0])
            check_finite(frame)
            inputs = as_leaves(frame.tensors)
            loss = self.loss_fn(self.head.module(**inputs), self._labels)
            loss.backward()
            grads = gradients_of(inputs)
            computed = {f"gradient for {n!r}": g for n, g in grads.items()}
            check_computed(
                frame, {"loss": loss.detach(), **computed}, self.head.module.parameters()
            )
        # The head steps with the front, once the server's gradients passed their checks
        # too: a refused step then leaves both as they were (nothing reads the head's
        # weights in between, so the numbers are the same).
        self._loss = float(loss.detach())
        return Frame(ids.meta(FrameKind.HEAD_GRADIENTS, self.mode, self.codec), grads)

    def _finish(self, frame: Frame) -> StepResult:
        ids = self._pending.check(frame, FrameKind.GRADIENTS, who="client")
        assert self._labels is not None and self._loss is not None
        samples = self._labels.shape[0]
        with refused_undone(self._rollback):
            conforms(frame, self.expect())
            check_batch(frame, samples)
            check_finite(frame)
            backward_into(self._outputs, frame.tensors)
            check_computed(frame, {}, self.front.module.parameters())
        self.head.step()
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
        limits: what the job allows a frame to hold (batch, steps); without them only
            the frame's form, its batch and its finiteness are checked.
        mode: the name of the mode that built the role, written into its frames.
    """

    def __init__(
        self,
        *,
        middle: Party,
        boundaries: tuple[tuple[BoundaryTensor, ...], tuple[BoundaryTensor, ...]],
        job: str,
        codec: str = "none",
        limits: FrameLimits | None = None,
        mode: str = NAME,
    ):
        self.mode = mode
        self.middle = middle
        self.boundaries = boundaries
        self.codec = codec
        self.limits = limits
        self.applied = AppliedSteps(job)
        self._pending = PendingStep()
        self._inputs: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, torch.Tensor] = {}
        self._samples = 0
        self._rollback: Rollback | None = None

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
        if self._pending.ids is not None:
            raise ProtocolError(
                f"server cannot start step {ids.order}: "
                f"step {self._pending.ids.order} is still in flight"
            )
        # Every check before the forward: a refused frame changes nothing here.
        check_training_step(frame, self.limits)
        conforms(frame, self.expect())
        samples = batch_of(frame)
        check_training_batch(frame, samples, self.limits)
        check_finite(frame)
        rollback = Rollback(self.middle)
        with refused_undone(rollback):
            inputs = as_leaves(frame.tensors)
            outputs = self.middle.module(**inputs)
            tensors = {name: t.detach() for name, t in outputs.items()}
            check_computed(frame, {f"output {n!r}": t for n, t in tensors.items()})
        self._pending.begin(ids, who="server")
        self._samples, self._rollback = samples, rollback
        self._inputs, self._outputs = inputs, outputs
        reply = Frame(ids.meta(FrameKind.HEAD_ACTIVATIONS, self.mode, self.codec), tensors)
        self.applied.record(frame, reply)
        return reply

    def _backward(self, frame: Frame) -> Frame:
        ids = self._pending.check(frame, FrameKind.HEAD_GRADIENTS, who="server")
        with refused_undone(self._rollback):
            conforms(frame, self.expect())
            check_batch(frame, self._samples)
            check_finite(frame)
            backward_into(self._outputs, frame.tensors)
            grads = gradients_of(self._inputs)
            computed = {f"gradient for {n!r}": g for n, g in grads.items()}
            check_computed(frame, computed, self.middle.module.parameters())
        self.middle.step()
        self._inputs, self._outputs, self._rollback = {}, {}, None
        self._pending.end()
        reply = Frame(ids.meta(FrameKind.GRADIENTS, self.mode, self.codec), grads)
        self.applied.record(frame, reply)
        return reply

    def expect(self) -> FrameSpec:
        if self._pending.ids is None:
            return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=boundary_spec(self.boundaries[0]))
        specs = gradient_spec(self.boundaries[1])
        return FrameSpec(kind=FrameKind.HEAD_GRADIENTS, tensors=specs, optional=frozenset(specs))
