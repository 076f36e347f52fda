"""MONAI transforms that make local data fit a job: resize and scale.

A job's augmentation is not here: it is the job's own (``JobDescription.augmentation``),
applied to each training batch by the core (:mod:`medsplit.training.augment`, through
:func:`medsplit.training.schedule.turn_batches`), so the agent, the simulator and the
unsplit reference draw the same transforms.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from monai.transforms import Compose, Resize, ScaleIntensity
from monai.utils import convert_to_tensor

from hospital_agent.data.local import DEFAULT_VAL_FRACTION, DataSummary, LocalData, load_local
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.sources import DataSource, check_job, read_image
from medsplit.data import DataSplit
from medsplit.errors import DataError
from medsplit.training.tasks import DEFAULT_TASK, SEGMENTATION, check_targets, get_task


def prepare(data: LocalData, *, input_shape: tuple[int, ...], num_classes: int) -> LocalData:
    """Fit both parts to the job: resize each image to ``input_shape`` and scale its
    intensities to [0, 1] (MONAI ``Resize`` then ``ScaleIntensity``, per image). Masks
    (a segmentation set) are resized with their images, nearest-neighbour, keeping
    their classes.

    Args:
        data: the local split, as loaded.
        input_shape: the job's ``(C, H, W)`` or ``(C, H, W, D)``.
        num_classes: the job's class count; every label must be below it.

    Raises:
        DataProblem: the channels or number of dimensions differ from ``input_shape``, or
            a label is outside ``0..num_classes-1``.
        ConfigError: ``input_shape`` or ``num_classes`` is malformed.
    """
    check_job(input_shape, num_classes)
    shape = tuple(data.train.images.shape[1:])
    if len(shape) != len(input_shape):
        raise DataProblem.one(
            None,
            f"images are {len(shape) - 1}-D {list(shape)} but the job expects "
            f"{len(input_shape) - 1}-D {list(input_shape)}",
        )
    if shape[0] != input_shape[0]:
        raise DataProblem.one(
            None,
            f"images have {shape[0]} channel(s) but the job expects {input_shape[0]}",
        )
    for part, split in (("train", data.train), ("val", data.val)):
        if len(split) and (split.labels.min() < 0 or split.labels.max() >= num_classes):
            raise DataProblem.one(
                None, f"{part} holds labels outside the job's classes 0..{num_classes - 1}"
            )
    spatial = tuple(input_shape[1:])
    transform = _fitting(spatial)
    masks = Resize(spatial, mode="nearest") if data.train.has_masks else None
    return LocalData(
        train=_apply(data.train, transform, empty_shape=tuple(input_shape), masks=masks),
        val=_apply(data.val, transform, empty_shape=tuple(input_shape), masks=masks),
    )


def load_for_job(
    source: DataSource,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    task: str = DEFAULT_TASK,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    seed: int = 0,
) -> tuple[LocalData, DataSummary]:
    """The local data as a turn of a job trains on it: read, checked, split, fitted to
    the job's shape (:func:`prepare`), its targets those of the job's task: a label per
    image, or a mask per image of the image's shape (a segmentation job).

    Returns:
        The fitted split and the summary of the data as read (before resizing).

    Raises:
        DataProblem: everything :func:`load_local` and :func:`prepare` find, or data that
            holds the targets of another task (labels for a segmentation job, masks for a
            classification job), before anything is trained.
        ConfigError: a malformed argument or an unknown task.
    """
    held = source.task
    if held != get_task(task).name:
        raise DataProblem.one(
            None,
            f"the job is a {task} job but this hospital's data is a {held} set "
            f"(data.task = {held}): a {task} job needs "
            + ("a mask per image" if task == SEGMENTATION else "a label per image"),
        )
    data, found = load_local(
        source,
        input_shape=input_shape,
        num_classes=num_classes,
        val_fraction=val_fraction,
        seed=seed,
    )
    prepared = prepare(data, input_shape=input_shape, num_classes=num_classes)
    for part, split in (("train", prepared.train), ("val", prepared.val)):
        try:
            check_targets(
                split.labels,
                task=task,
                num_classes=num_classes,
                input_shape=tuple(input_shape),
                where=f"the local {part} split",
            )
        except DataError as e:
            raise DataProblem.one(None, str(e)) from e
    return prepared, found


def _fitting(spatial: tuple[int, ...]) -> Compose:
    """One image to the job's spatial shape, its intensities to [0, 1]: what the model
    sees, in training and in prediction alike."""
    return Compose(
        [
            Resize(spatial, mode="bilinear" if len(spatial) == 2 else "trilinear"),
            ScaleIntensity(minv=0.0, maxv=1.0),
        ]
    )


def _apply(
    split: DataSplit,
    transform: Compose,
    *,
    empty_shape: tuple[int, ...] = (),
    masks: Resize | None = None,
) -> DataSplit:
    if len(split) == 0:
        shape = empty_shape or tuple(split.images.shape[1:])
        labels = split.labels.clone()
        if masks is not None:
            labels = torch.empty((0, 1, *shape[1:]), dtype=torch.int64)
        return DataSplit(torch.empty((0, *shape), dtype=torch.float32), labels)
    images = torch.stack(
        [
            convert_to_tensor(transform(image), track_meta=False).to(torch.float32)
            for image in split.images
        ]
    )
    labels = split.labels.clone()
    if masks is not None and tuple(labels.shape[2:]) != tuple(images.shape[2:]):
        resized = [
            convert_to_tensor(masks(mask.to(torch.float32)), track_meta=False)
            for mask in split.labels
        ]
        labels = torch.stack(resized).round().to(torch.int64)
    return DataSplit(images=images.clamp_(0.0, 1.0).contiguous(), labels=labels.contiguous())


def load_for_prediction(
    paths: Sequence[str | os.PathLike[str]], *, input_shape: tuple[int, ...]
) -> torch.Tensor:
    """Images to predict on, read and fitted as a folder's training images are: MONAI's
    reader per file, intensities scaled to [0, 1], resized to the job's ``input_shape``
    and scaled again (``read_image``, ``ScaleIntensity``, then :func:`prepare`'s
    transforms), stacked ``(N, *input_shape)``.

    Raises:
        DataProblem: a file cannot be read, or its channels or dimensions are not the
            job's (a file that cannot be resized to fit); the message names the file.
    """
    check_job(input_shape, 2)
    if not paths:
        raise DataProblem.one(None, "no images to predict on")
    scale = ScaleIntensity(minv=0.0, maxv=1.0)
    fit = _fitting(tuple(input_shape[1:]))
    images = []
    for path in paths:
        image = read_image(path)
        if image.dim() != len(input_shape) or image.shape[0] != input_shape[0]:
            raise DataProblem.one(
                os.fspath(path),
                f"has shape {list(image.shape)} (channels first); the job takes "
                f"{list(input_shape)}: other channels or dimensions cannot be resized to fit",
            )
        scaled = convert_to_tensor(scale(image), track_meta=False).to(torch.float32)
        images.append(convert_to_tensor(fit(scaled), track_meta=False).to(torch.float32))
    return torch.stack(images).clamp_(0.0, 1.0).contiguous()  # as :func:`_apply` does
