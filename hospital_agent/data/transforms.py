"""MONAI transforms that make local data fit a job: resize and scale.

A job's augmentation is not here: it is the job's own (``JobDescription.augmentation``),
applied to each training batch by the core (:mod:`medsplit.training.augment`, through
:func:`medsplit.training.schedule.turn_batches`), so the agent, the simulator and the
unsplit reference draw the same transforms.
"""

from __future__ import annotations

import torch
from monai.transforms import Compose, Resize, ScaleIntensity

from hospital_agent.data.local import LocalData
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.sources import check_job
from medsplit.data import DataSplit


def prepare(data: LocalData, *, input_shape: tuple[int, ...], num_classes: int) -> LocalData:
    """Fit both parts to the job: resize each image to ``input_shape`` and scale its
    intensities to [0, 1] (MONAI ``Resize`` then ``ScaleIntensity``, per image).

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
    transform = Compose(
        [
            Resize(spatial, mode="bilinear" if len(spatial) == 2 else "trilinear"),
            ScaleIntensity(minv=0.0, maxv=1.0),
        ]
    )
    return LocalData(
        train=_apply(data.train, transform, empty_shape=tuple(input_shape)),
        val=_apply(data.val, transform, empty_shape=tuple(input_shape)),
    )


def _apply(split: DataSplit, transform: Compose, *, empty_shape: tuple[int, ...] = ()) -> DataSplit:
    if len(split) == 0:
        shape = empty_shape or tuple(split.images.shape[1:])
        return DataSplit(torch.empty((0, *shape), dtype=torch.float32), split.labels.clone())
    images = torch.stack(
        [torch.as_tensor(transform(image)).to(torch.float32) for image in split.images]
    )
    return DataSplit(images=images.clamp_(0.0, 1.0).contiguous(), labels=split.labels.clone())
