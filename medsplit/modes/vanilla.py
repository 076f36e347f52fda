"""Vanilla split learning: the hospital runs the front, the server the rest and the loss.

Gupta & Raskar, "Distributed learning of deep neural network over multiple agents",
2018. Labels travel to the server with the activations.
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
    check_labels,
    check_logits,
    check_training_batch,
    check_training_step,
    conforms,
)
from medsplit.protocol.party import Party
from medsplit.protocol.roles import (
    LABELS,
    LOGITS,
    LOSS,
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
    gradient_spec,
    gradients_of,
    refused_undone,
)
from medsplit.wire import Frame, FrameKind, FrameSpec, TensorSpec

NAME = "vanilla"


class VanillaMode(SplitMode):
    """One cut: the hospital holds the front, the server the tail, the labels and the loss."""

    name = NAME
    title = "Vanilla"
    summary = "the hospital keeps the first layers; the server the rest and the labels"
    cuts = 1
    labels = Side.SERVER
    label_probes = True

    def client_segments(self) -> dict[str, int]:
        return {"front": 0}

    def client_role(
        self,
        parties: Mapping[str, Party],
        split: SplitModel,
        *,
        codec: str = "none",
        loss_fn: LossFn | None = None,
    ) -> VanillaClient:
        return VanillaClient(
            front=parties["front"], boundary=split.boundaries[0], codec=codec, mode=self.name
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
    ) -> VanillaServer:
        return VanillaServer(
            tail=party,
            boundary=split.boundaries[0],
            job=job,
            loss_fn=loss_fn,
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
        """The server's tail ends in the logits: one floating tensor, ``(B, classes)``
        (``(B, classes, *spatial)`` for a segmentation job's masks), checked."""
        logits = frame.tensors.get(LOGITS)
        dtype = logits.dtype if logits is not None and logits.dtype.is_floating_point else None
        spatial = (None,) * len(limits.label_shape[1:])  # their sizes: check_logits
        spec = FrameSpec(
            kind=FrameKind.EVAL_OUTPUTS,
            tensors={LOGITS: TensorSpec((None, None, *spatial), dtype or torch.float32)},
        )
        conforms(frame, spec)
        check_logits(frame, frame.tensors[LOGITS], samples, limits)
        return frame.tensors[LOGITS]


class VanillaClient(ClientRole):
    """Runs the front on local images, sends activations and labels, applies the gradients.

    Args:
        front: the front segment with its optimizer.
        boundary: the tensors crossing the cut (``SplitModel.boundaries[0]``).
        codec: wire codec for what this client sends.
        mode: the name of the mode that built the role, written into its frames.
    """

    def __init__(
        self,
        *,
        front: Party,
        boundary: tuple[BoundaryTensor, ...],
        codec: str = "none",
        mode: str = NAME,
    ):
        self.mode = mode
        self.front = front
        self.boundary = boundary
        self.codec = codec
        self._pending = PendingStep()
        self._outputs: dict[str, torch.Tensor] = {}
        self._samples = 0
        self._rollback: Rollback | None = None

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor) -> Frame:
        self._pending.begin(ids, who="client")
        self._rollback = Rollback(self.front)
        self._outputs = self.front.module(x)
        self._samples = x.shape[0]
        tensors = {name: t.detach() for name, t in self._outputs.items()}
        tensors[LABELS] = y
        return Frame(ids.meta(FrameKind.ACTIVATIONS, self.mode, self.codec), tensors)

    def receive(self, frame: Frame) -> StepResult:
        ids = self._pending.check(frame, FrameKind.GRADIENTS, who="client")
        with refused_undone(self._rollback):
            conforms(frame, self.expect())
            check_batch(frame, self._samples)
            check_finite(frame)
            backward_into(self._outputs, frame.tensors)
            check_computed(frame, {}, self.front.module.parameters())
        self.front.step()
        self._outputs = {}
        self._pending.end()
        return StepResult(ids, loss=float(frame.tensors[LOSS]), samples=self._samples)

    def expect(self) -> FrameSpec:
        specs = gradient_spec(self.boundary)
        specs[LOSS] = TensorSpec((), torch.float32)
        return FrameSpec(
            kind=FrameKind.GRADIENTS, tensors=specs, optional=frozenset(specs) - {LOSS}
        )


class VanillaServer(ServerRole):
    """Runs the tail and the loss on received activations, returns the gradient at the cut.

    Args:
        tail: the last segment (``SplitModel.tail``) with its optimizer.
        boundary: the tensors crossing the cut.
        job: the job this server serves; frames of other jobs are refused.
        loss_fn: loss on (logits, labels); cross-entropy by default (a segmentation
            job's is :meth:`TrainingConfig.loss_fn`).
        codec: wire codec for what this server sends.
        limits: what the job allows a frame to hold (batch, classes, steps, the shape
            of a label: a class index, or a mask); without them only the frame's form,
            its batch and its finiteness are checked, and labels are class indices.
        mode: the name of the mode that built the role, written into its frames.
    """

    def __init__(
        self,
        *,
        tail: Party,
        boundary: tuple[BoundaryTensor, ...],
        job: str,
        loss_fn: LossFn | None = None,
        codec: str = "none",
        limits: FrameLimits | None = None,
        mode: str = NAME,
    ):
        self.mode = mode
        self.tail = tail
        self.boundary = boundary
        self.loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
        self.codec = codec
        self.limits = limits
        self.applied = AppliedSteps(job)

    def handle(self, frame: Frame) -> Frame:
        if frame.meta.kind != FrameKind.ACTIVATIONS:
            raise ProtocolError(f"vanilla server cannot handle a {frame.meta.kind} frame")
        again = self.applied.answer_again(frame, who="server")
        if again is not None:
            return again
        ids = StepIds.of(frame)
        # Every check before the forward: a refused frame changes nothing here.
        check_training_step(frame, self.limits)
        conforms(frame, self.expect())
        check_training_batch(frame, batch_of(frame), self.limits)
        check_finite(frame)
        labels = frame.tensors[LABELS]
        check_labels(frame, labels, self.limits)
        with refused_undone(Rollback(self.tail)):
            inputs = as_leaves({t.name: frame.tensors[t.name] for t in self.boundary})
            loss = self.loss_fn(self.tail.module(**inputs), labels)
            loss.backward()
            grads = gradients_of(inputs)
            computed = {f"gradient for {n!r}": g for n, g in grads.items()}
            check_computed(
                frame, {"loss": loss.detach(), **computed}, self.tail.module.parameters()
            )
        self.tail.step()
        grads[LOSS] = loss.detach().float()
        reply = Frame(ids.meta(FrameKind.GRADIENTS, self.mode, self.codec), grads)
        self.applied.record(frame, reply)
        return reply

    def expect(self) -> FrameSpec:
        specs = boundary_spec(self.boundary)
        label_shape = self.limits.label_shape if self.limits is not None else ()
        specs[LABELS] = TensorSpec((None, *label_shape), torch.int64)
        return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=specs)
