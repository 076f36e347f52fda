"""Label leakage where the labels stay at the hospital: what its gradients say.

In U-shaped mode the hospital sends the server the gradient at the second cut (from the
head's loss back to the middle's output). That gradient depends on the labels: Li et al.
(ICLR 2022) recover binary labels from its norm and its direction. The hospital holds both
the labels and what it sent, so it can score the attacks itself: the same scores and AUC
as a vertical job's audit (:mod:`medsplit.training.label_leakage`).
"""

from __future__ import annotations

import torch

from medsplit.protocol.roles import ClientRole, StepIds, StepResult
from medsplit.training.label_leakage import LeakageScores
from medsplit.wire import Frame, FrameKind, FrameSpec

__all__ = ["LABEL_GRADIENTS", "GradientRecorder"]

#: What a client sends that its labels shaped: the gradients from the head's loss.
LABEL_GRADIENTS = frozenset({FrameKind.HEAD_GRADIENTS})


class GradientRecorder(ClientRole):
    """A client role that runs ``inner`` unchanged and scores every frame it sends up
    whose kind is in :data:`LABEL_GRADIENTS` against the batch's labels."""

    def __init__(self, inner: ClientRole, scores: LeakageScores | None = None):
        self.inner = inner
        self.mode = inner.mode
        self.scores = scores if scores is not None else LeakageScores()
        self._labels: torch.Tensor | None = None

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor) -> Frame:
        self._labels = y
        return self._note(self.inner.start(ids, x, y))

    def receive(self, frame: Frame) -> Frame | StepResult:
        out = self.inner.receive(frame)
        return self._note(out) if isinstance(out, Frame) else out

    def expect(self) -> FrameSpec:
        return self.inner.expect()

    def _note(self, frame: Frame) -> Frame:
        if frame.meta.kind in LABEL_GRADIENTS and self._labels is not None:
            # Every tensor of the frame, each record's values side by side.
            per_record = torch.cat(
                [t.detach().reshape(t.shape[0], -1) for t in frame.tensors.values()], dim=1
            )
            self.scores.add(per_record, self._labels)
        return frame
