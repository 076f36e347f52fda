"""Loss and accuracy of a (split) model on held-out data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from medsplit.data import Split


@dataclass(frozen=True)
class Evaluation:
    loss: float
    accuracy: float
    samples: int


def evaluate(
    segments: Sequence[torch.nn.Module], data: Split, *, batch_size: int = 256
) -> Evaluation:
    """Run the segments one after another over ``data`` in eval mode, without gradients.

    Every module's training flag is restored afterwards, so evaluating between training
    steps changes nothing about training.
    """
    modules = [m for segment in segments for m in segment.modules()]
    flags = {m: m.training for m in modules}
    for segment in segments:
        segment.eval()
    total_loss, correct = 0.0, 0
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    try:
        with torch.no_grad():
            for start in range(0, len(data), batch_size):
                x = data.images[start : start + batch_size]
                y = data.labels[start : start + batch_size]
                out = segments[0](x)
                for segment in segments[1:]:
                    out = segment(**out)
                total_loss += float(loss_fn(out, y))
                correct += int((out.argmax(dim=1) == y).sum())
    finally:
        for module, flag in flags.items():
            module.training = flag
    n = len(data)
    return Evaluation(
        loss=total_loss / n if n else 0.0, accuracy=correct / n if n else 0.0, samples=n
    )
