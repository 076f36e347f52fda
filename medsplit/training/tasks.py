"""What a job learns: its task (classification or segmentation), its loss and its metric.

A task fixes the form of a training target and of the model's output:

- ``classification``: one class index per sample, int64 ``(N,)``; the model outputs
  logits ``(N, num_classes)``; the loss is cross-entropy, the metric accuracy.
- ``segmentation``: one mask per sample, int64 ``(N, 1, *spatial)`` of class indices in
  ``[0, num_classes)`` (MONAI's channel-first form; :class:`~medsplit.data.DataSplit`
  takes ``(N, *spatial)`` too and adds the channel); the model outputs logits
  ``(N, num_classes, *spatial)``; the loss is one of MONAI's (``DiceCELoss`` by
  default, always with ``to_onehot_y=True, softmax=True``), the metric mean Dice
  (:func:`medsplit.training.evaluate.segmentation_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from medsplit.errors import ConfigError, DataError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

CLASSIFICATION = "classification"
SEGMENTATION = "segmentation"
DEFAULT_TASK = CLASSIFICATION


@dataclass(frozen=True)
class TaskSpec:
    """One task a job may have.

    Attributes:
        name: ``"classification"`` or ``"segmentation"``.
        description: one line for people.
        losses: the loss names a job of this task may choose.
        default_loss: the loss of a job that names none (one of ``losses``).
        metric: what validation reports besides the loss (``val_<metric>``):
            ``"accuracy"`` or ``"dice"``.
    """

    name: str
    description: str
    losses: tuple[str, ...]
    default_loss: str
    metric: str

    def to_json(self) -> dict[str, object]:
        """The form ``GET /api/tasks/`` serves."""
        return {
            "name": self.name,
            "description": self.description,
            "losses": list(self.losses),
            "default_loss": self.default_loss,
            "metric": self.metric,
        }


TASKS: dict[str, TaskSpec] = {
    CLASSIFICATION: TaskSpec(
        name=CLASSIFICATION,
        description="one class per image (labels of shape (N,)); accuracy in validation",
        losses=("CrossEntropyLoss",),
        default_loss="CrossEntropyLoss",
        metric="accuracy",
    ),
    SEGMENTATION: TaskSpec(
        name=SEGMENTATION,
        description="one class per pixel (masks of shape (N, 1, H, W)); mean Dice in validation",
        losses=("DiceCELoss", "DiceLoss", "DiceFocalLoss"),
        default_loss="DiceCELoss",
        metric="dice",
    ),
}


def get_task(name: str) -> TaskSpec:
    """The task called ``name``.

    Raises:
        ConfigError: an unknown task; the message lists the known ones.
    """
    try:
        return TASKS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None


def loss_name(task: str, loss: str = "") -> str:
    """The loss a job of ``task`` trains with: ``loss``, or the task's default for ``""``.

    Raises:
        ConfigError: an unknown task, or a loss that is not one of the task's.
    """
    spec = get_task(task)
    if loss == "":
        return spec.default_loss
    if not isinstance(loss, str) or loss not in spec.losses:
        raise ConfigError(
            f"{loss!r} is not a loss of the {spec.name} task; choose one of "
            f"{', '.join(spec.losses)} (or none for {spec.default_loss})"
        )
    return loss


def make_loss(task: str = DEFAULT_TASK, loss: str = "") -> LossFn:
    """The loss function on (logits, targets) of a job of ``task`` choosing ``loss``.

    Segmentation losses are MONAI's, on softmax probabilities of ``(N, C, *spatial)``
    logits against ``(N, 1, *spatial)`` class-index masks (one-hot encoded inside).

    Raises:
        ConfigError: as :func:`loss_name`.
    """
    name = loss_name(task, loss)
    if name == "CrossEntropyLoss":
        return torch.nn.CrossEntropyLoss()
    from monai import losses  # here: a classification job never needs MONAI's losses

    return getattr(losses, name)(to_onehot_y=True, softmax=True)


def label_shape(task: str, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one sample's training target: ``()`` for a class index, ``(1,
    *spatial)`` for a mask of an input of ``input_shape`` ``(C, *spatial)``.

    Raises:
        ConfigError: an unknown task.
    """
    if get_task(task).name == SEGMENTATION:
        return (1, *tuple(input_shape)[1:])
    return ()


def check_targets(
    labels: torch.Tensor,
    *,
    task: str,
    num_classes: int,
    input_shape: tuple[int, ...],
    where: str = "the labels",
) -> None:
    """The targets of some samples fit a job: int64, each of :func:`label_shape`, every
    value a class index in ``[0, num_classes)``. ``where`` names them (a file, a split).

    Raises:
        DataError: naming ``where``, the shape or the values found and what the job needs.
    """
    want = label_shape(task, input_shape)
    kind = "masks" if want else "labels"
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64:
        found = f"a {labels.dtype} tensor" if isinstance(labels, torch.Tensor) else type(labels)
        raise DataError(f"{where}: {kind} must be int64 class indices, got {found}")
    if tuple(labels.shape[1:]) != want:
        raise DataError(
            f"{where}: {kind} of shape {tuple(labels.shape)}; this {task} job needs "
            f"(N, {', '.join(map(str, want))})"
            if want
            else f"{where}: labels of shape {tuple(labels.shape)}; this {task} job needs (N,)"
        )
    if labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            raise DataError(
                f"{where}: {kind} hold values in [{low}, {high}]; the job has classes "
                f"0..{num_classes - 1} (check them against the job's num_classes)"
            )


def check_model_output(
    task: str, output: object, *, input_shape: tuple[int, ...], num_classes: int
) -> None:
    """A model's output on a batch of inputs of ``input_shape`` fits the task:
    ``(N, num_classes)`` logits for classification, ``(N, num_classes, *spatial)`` for
    segmentation.

    Raises:
        ConfigError: another output, naming the shape found and the one needed.
    """
    spatial = tuple(input_shape)[1:] if get_task(task).name == SEGMENTATION else ()
    want = (num_classes, *spatial)
    if not isinstance(output, torch.Tensor) or tuple(output.shape[1:]) != want:
        found = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        kind = "a segmentation model" if spatial else "a classifier"
        raise ConfigError(
            f"a {task} job needs {kind} whose output is (N, {', '.join(map(str, want))}); "
            f"this model outputs {found}"
        )
