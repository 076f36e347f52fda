"""MONAI transforms that make local data fit a job: resize, scale, optionally augment.

Exactness: split training reproduces unsplit training on the same data only without
augmentation, or when both runs augment with the same :class:`AugmentConfig` (same seed)
and the same epochs, since the augmented images depend only on ``(seed, epoch)`` and the
images' order.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from monai.transforms import Compose, RandFlip, RandRotate, Resize, ScaleIntensity

from hospital_agent.data.local import LocalData
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.sources import check_job
from medsplit.data import DataSplit
from medsplit.errors import ConfigError

MAX_ROTATE_DEGREES = 30.0  # "small" rotations only


@dataclass(frozen=True)
class AugmentConfig:
    """A job's training-time augmentation; off by default.

    Attributes:
        flip_prob: probability of flipping an image left-right (its last spatial axis
            for 2-D, its second for volumes ``(C, H, W, D)``).
        rotate_degrees: each image is rotated in its (H, W) plane by an angle drawn
            uniformly from ``[-rotate_degrees, rotate_degrees]``; 0 turns rotation off.
        seed: with the epoch, fixes every random draw.

    Raises:
        ConfigError: a value out of range.
    """

    flip_prob: float = 0.0
    rotate_degrees: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.flip_prob, int | float) or not 0 <= self.flip_prob <= 1:
            raise ConfigError(f"flip_prob must be in [0, 1], got {self.flip_prob!r}")
        if (
            not isinstance(self.rotate_degrees, int | float)
            or not 0 <= self.rotate_degrees <= MAX_ROTATE_DEGREES
        ):
            raise ConfigError(
                f"rotate_degrees must be in [0, {MAX_ROTATE_DEGREES}], got {self.rotate_degrees!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def enabled(self) -> bool:
        return self.flip_prob > 0 or self.rotate_degrees > 0


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
    transform = Compose(
        [
            Resize(spatial, mode="bilinear" if len(spatial) == 2 else "trilinear"),
            ScaleIntensity(minv=0.0, maxv=1.0),
        ]
    )
    masks = Resize(spatial, mode="nearest") if data.train.has_masks else None
    return LocalData(
        train=_apply(data.train, transform, empty_shape=tuple(input_shape), masks=masks),
        val=_apply(data.val, transform, empty_shape=tuple(input_shape), masks=masks),
    )


def augment(split: DataSplit, config: AugmentConfig, *, epoch: int) -> DataSplit:
    """The training images of one epoch, augmented; ``split`` itself when augmentation
    is off. Call it on the prepared train part only, once per epoch.

    The draws depend only on ``(config.seed, epoch)`` and the images' order (MONAI's
    random state is seeded here; the global RNG is unused), so the same call gives the
    same images. Labels are unchanged.

    Raises:
        ConfigError: ``epoch`` is not an integer >= 0.
    """
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}")
    if not config.enabled or len(split) == 0:
        return split
    if split.has_masks:
        # These draws move images only; a mask would no longer fit its image.
        raise ConfigError(
            "AugmentConfig transforms images alone; a segmentation set's masks must move "
            "with them (the job's augmentation does)"
        )
    spatial_dims = split.images.dim() - 2
    steps = []
    if config.flip_prob > 0:
        steps.append(RandFlip(prob=config.flip_prob, spatial_axis=1))
    if config.rotate_degrees > 0:
        angle = math.radians(config.rotate_degrees)
        # 2-D: the only plane. 3-D (C, H, W, D): about the depth axis, i.e. in (H, W).
        plane = {"range_x": angle} if spatial_dims == 2 else {"range_z": angle}
        steps.append(
            RandRotate(prob=1.0, keep_size=True, padding_mode="border", **plane)  # type: ignore[arg-type]
        )
    transform = Compose(steps)
    transform.set_random_state(seed=_epoch_seed(config.seed, epoch))
    return _apply(split, transform)


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
        [torch.as_tensor(transform(image)).to(torch.float32) for image in split.images]
    )
    labels = split.labels.clone()
    if masks is not None and tuple(labels.shape[2:]) != tuple(images.shape[2:]):
        resized = [torch.as_tensor(masks(mask.to(torch.float32))) for mask in split.labels]
        labels = torch.stack(resized).round().to(torch.int64)
    return DataSplit(images=images.clamp_(0.0, 1.0).contiguous(), labels=labels.contiguous())


def _epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"hospital-agent-augment:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "big")  # numpy's RandomState takes 32 bits
