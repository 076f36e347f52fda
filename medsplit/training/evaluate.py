"""Loss and accuracy (classification) or mean Dice (segmentation) of a (split) model on
held-out data."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from monai.metrics import compute_roc_auc

from medsplit.data import DataSplit
from medsplit.protocol.roles import LossFn, eval_mode
from medsplit.training.tasks import CLASSIFICATION, SEGMENTATION, get_task, make_loss

__all__ = [
    "Evaluation",
    "MajorityBaseline",
    "classification_metrics",
    "eval_mode",
    "evaluate",
    "majority_baseline",
    "score",
    "segmentation_metrics",
    "task_metrics",
]


@dataclass(frozen=True)
class Evaluation:
    """Validation of one split: mean loss over samples, and the task's metric
    (``accuracy`` for classification; ``dice``, mean Dice, for segmentation, whose
    ``accuracy`` is then the share of pixels labelled right)."""

    loss: float
    accuracy: float
    samples: int
    dice: float | None = None

    @property
    def metric(self) -> float:
        """The task's metric: Dice where there is one, else accuracy."""
        return self.dice if self.dice is not None else self.accuracy


def evaluate(
    segments: Sequence[torch.nn.Module],
    data: DataSplit,
    *,
    batch_size: int = 256,
    task: str = CLASSIFICATION,
    loss_fn: LossFn | None = None,
) -> Evaluation:
    """Run the segments one after another over ``data`` in eval mode, without gradients.

    Every module's training flag is restored afterwards, so evaluating between training
    steps changes nothing about training. A segmentation ``task`` reports the mean of
    ``loss_fn`` (by default the task's default loss) over batches weighted by their
    size, and mean Dice (:func:`segmentation_metrics`).
    """
    if get_task(task).name == SEGMENTATION:
        outputs = list(_through(segments, data, batch_size))
        if not outputs:
            return Evaluation(loss=0.0, accuracy=0.0, samples=0, dice=0.0)
        logits = torch.cat([out for out, _ in outputs])
        values = segmentation_metrics(logits, data.labels, loss_fn=loss_fn)
        return Evaluation(
            loss=values["val_loss"],
            accuracy=values["val_pixel_accuracy"],
            samples=len(data),
            dice=values["val_dice"],
        )
    total_loss, correct = 0.0, 0
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    for out, y in _through(segments, data, batch_size):
        total_loss += float(loss_fn(out, y))
        correct += int((out.argmax(dim=1) == y).sum())
    n = len(data)
    return Evaluation(
        loss=total_loss / n if n else 0.0, accuracy=correct / n if n else 0.0, samples=n
    )


def score(
    segments: Sequence[torch.nn.Module], data: DataSplit, *, batch_size: int = 256
) -> dict[str, float]:
    """:func:`classification_metrics` of the segments run one after another over
    ``data`` (a test split, say), as :func:`evaluate` runs them."""
    outputs = list(_through(segments, data, batch_size))
    if not outputs:
        return classification_metrics(torch.empty(0, 0), data.labels)
    return classification_metrics(
        torch.cat([out for out, _ in outputs]), torch.cat([y for _, y in outputs])
    )


def _through(
    segments: Sequence[torch.nn.Module], data: DataSplit, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(outputs, labels) per batch, in eval mode, without gradients."""
    with eval_mode(segments), torch.no_grad():
        for start in range(0, len(data), batch_size):
            out = segments[0](data.images[start : start + batch_size])
            for segment in segments[1:]:
                out = segment(**out)
            yield out, data.labels[start : start + batch_size]


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Loss, accuracy and (where every class is present) macro ROC AUC of ``logits``.

    AUC is MONAI's ``compute_roc_auc`` on softmax probabilities, one class against the
    rest, averaged over classes; it is left out when a class has no sample, since AUC is
    then undefined.
    """
    n = int(labels.shape[0])
    if n == 0:
        return {"val_samples": 0.0}
    logits = logits.float()
    values = {
        "val_loss": float(torch.nn.functional.cross_entropy(logits, labels)),
        "val_accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        "val_samples": float(n),
    }
    classes = logits.shape[1]
    if classes >= 2 and int(labels.unique().numel()) == classes:
        probabilities = torch.softmax(logits, dim=1)
        onehot = torch.nn.functional.one_hot(labels, classes)
        values["val_auc"] = float(compute_roc_auc(probabilities, onehot, average="macro"))
    return values


def segmentation_metrics(
    logits: torch.Tensor, masks: torch.Tensor, *, loss_fn: LossFn | None = None
) -> dict[str, float]:
    """Loss, mean Dice and pixel accuracy of ``(N, C, *spatial)`` logits against
    ``(N, 1, *spatial)`` masks.

    Dice is MONAI's ``DiceMetric`` on the one-hot argmax against the one-hot masks,
    ``include_background=False`` (the background fills most of a medical image and would
    make any model look good), averaged over samples and the foreground classes; a
    class absent from both a sample's mask and its prediction counts as 1 there, absent
    from the mask but predicted as 0 (``ignore_empty=False``), so the mean is always
    defined. ``loss_fn`` defaults to the segmentation task's default loss.
    """
    from monai.metrics import DiceMetric

    n = int(masks.shape[0])
    if n == 0:
        return {"val_samples": 0.0}
    logits = logits.float()
    classes = int(logits.shape[1])
    loss_fn = loss_fn or make_loss(SEGMENTATION)
    predicted = logits.argmax(dim=1, keepdim=True)
    onehot = torch.nn.functional.one_hot
    as_onehot = lambda m: onehot(m.squeeze(1), classes).movedim(-1, 1)  # noqa: E731
    metric = DiceMetric(include_background=False, reduction="mean", ignore_empty=False)
    dice = metric(as_onehot(predicted), as_onehot(masks))
    return {
        "val_loss": float(loss_fn(logits, masks)),
        "val_dice": float(dice.nanmean()) if dice.numel() else 0.0,
        "val_pixel_accuracy": float((predicted == masks).float().mean()),
        "val_samples": float(n),
    }


def task_metrics(
    task: str, logits: torch.Tensor, labels: torch.Tensor, *, loss_fn: LossFn | None = None
) -> dict[str, float]:
    """Validation metrics of ``task``: :func:`classification_metrics` (``val_accuracy``)
    or :func:`segmentation_metrics` (``val_dice``), as the turns report them."""
    if get_task(task).name == SEGMENTATION:
        return segmentation_metrics(logits, labels, loss_fn=loss_fn)
    return classification_metrics(logits, labels)


@dataclass(frozen=True)
class MajorityBaseline:
    """What always answering the training data's most common class scores.

    Attributes:
        label: that class (the smallest of the tied ones).
        accuracy: the share of the evaluated labels equal to it (0 with none).
    """

    label: int
    accuracy: float

    def describe(self) -> str:
        """``"majority-class baseline 0.731 (always class 0)"``, to print beside an accuracy."""
        return f"majority-class baseline {self.accuracy:.3f} (always class {self.label})"


def majority_baseline(train_labels: torch.Tensor, labels: torch.Tensor) -> MajorityBaseline:
    """The accuracy on ``labels`` of always predicting ``train_labels``' most common class:
    the score a model that learned only the class prior gets, to print beside its accuracy."""
    train = train_labels.reshape(-1).long()
    label = int(torch.bincount(train).argmax()) if len(train) else 0
    evaluated = labels.reshape(-1)
    accuracy = int((evaluated == label).sum()) / len(evaluated) if len(evaluated) else 0.0
    return MajorityBaseline(label=label, accuracy=accuracy)
