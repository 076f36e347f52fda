"""A job's training-time augmentation: MONAI random transforms, drawn per step.

A job names its transforms as a JSON list (``TrainingConfig.augmentation``,
``JobDescription.augmentation``), each item ``{"name": NAME, PARAM: VALUE, ...}`` with
``NAME`` from :data:`TRANSFORMS` and the parameters it leaves out at their defaults::

    [{"name": "flip", "prob": 0.5, "axis": 1}, {"name": "rotate", "degrees": 10}]

:func:`~medsplit.training.schedule.turn_batches` applies them to every training batch, so
the agent, the in-process simulator and the unsplit reference train on the same images.
Each step's draws are seeded from ``(job seed, round, hospital position, step)`` alone
(:func:`step_seed`): a step taken again after a resume, or by the unsplit reference, draws
the same transforms, and training stays exact. A segmentation mask is moved with its
image (the same flips and rotations, nearest-neighbour, no intensity change); class
labels are left as they are. Validation batches are never augmented.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from monai.transforms import (
    Compose,
    MapTransform,
    RandFlipd,
    RandRotate90d,
    RandRotated,
    RandScaleIntensityd,
    RandShiftIntensityd,
)
from monai.utils import convert_to_tensor

from medsplit.errors import ConfigError

#: The most transforms a job may name: each runs on every training image of every step.
MAX_TRANSFORMS = 16

_IMAGE, _MASK = "image", "mask"
_BOTH = (_IMAGE, _MASK)


class AugmentationError(ConfigError):
    """An augmentation list that cannot be used.

    Attributes:
        reasons: every problem found, one sentence each.
    """

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("augmentation: " + " / ".join(self.reasons))


@dataclass(frozen=True)
class Param:
    """One parameter of a transform: a number in ``[low, high]``."""

    default: float | int
    low: float | int
    high: float | int
    help: str
    integer: bool = False


@dataclass(frozen=True)
class TransformSpec:
    """A transform a job can name.

    Attributes:
        name: what an item's ``name`` takes.
        description: one line, for the API and the dashboard.
        params: its parameters by name, with their defaults and ranges.
        spatial: whether it moves pixels (then a mask follows the image).
        build: the MONAI dictionary transform from the item's parameters and the
            images' number of spatial dimensions.
    """

    name: str
    description: str
    params: Mapping[str, Param]
    spatial: bool
    build: Callable[[Mapping[str, Any], int], MapTransform]


_PROB = Param(0.5, 0.0, 1.0, "probability that an image gets this transform")


def _flip(p: Mapping[str, Any], dims: int) -> MapTransform:
    return RandFlipd(_BOTH, prob=p["prob"], spatial_axis=p["axis"], allow_missing_keys=True)


def _rotate90(p: Mapping[str, Any], dims: int) -> MapTransform:
    # In the (H, W) plane: spatial axes 0 and 1 of (C, H, W) and of (C, H, W, D).
    return RandRotate90d(_BOTH, prob=p["prob"], spatial_axes=(0, 1), allow_missing_keys=True)


def _rotate(p: Mapping[str, Any], dims: int) -> MapTransform:
    angle = math.radians(p["degrees"])
    # 2-D: the only plane. 3-D (C, H, W, D): about the depth axis, i.e. in (H, W).
    plane = {"range_x": angle} if dims == 2 else {"range_z": angle}
    return RandRotated(
        _BOTH,
        prob=p["prob"],
        keep_size=True,
        mode=("bilinear", "nearest"),  # a mask's values stay class indices
        padding_mode=("border", "zeros"),  # what rotates in of a mask is background
        allow_missing_keys=True,
        **plane,  # type: ignore[arg-type]
    )


def _shift(p: Mapping[str, Any], dims: int) -> MapTransform:
    return RandShiftIntensityd((_IMAGE,), offsets=p["offset"], prob=p["prob"])


def _scale(p: Mapping[str, Any], dims: int) -> MapTransform:
    return RandScaleIntensityd((_IMAGE,), factors=p["factor"], prob=p["prob"])


#: Every transform a job can name, by name.
TRANSFORMS: Mapping[str, TransformSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            TransformSpec(
                "flip",
                "mirror the image (and its mask) along one spatial axis (MONAI RandFlip)",
                {
                    "prob": _PROB,
                    "axis": Param(
                        1, 0, 2, "spatial axis: 0 is H (up-down), 1 is W (left-right)", True
                    ),
                },
                True,
                _flip,
            ),
            TransformSpec(
                "rotate90",
                "turn the image (and its mask) by 90, 180 or 270 degrees in its (H, W) plane; "
                "square images only (MONAI RandRotate90)",
                {"prob": _PROB},
                True,
                _rotate90,
            ),
            TransformSpec(
                "rotate",
                "rotate the image (and its mask, nearest-neighbour) in its (H, W) plane by an "
                "angle drawn from [-degrees, degrees] (MONAI RandRotate)",
                {"prob": _PROB, "degrees": Param(15.0, 0.0, 180.0, "largest angle, degrees")},
                True,
                _rotate,
            ),
            TransformSpec(
                "shift_intensity",
                "add an offset drawn from [-offset, offset] to the image; masks unchanged "
                "(MONAI RandShiftIntensity)",
                {"prob": _PROB, "offset": Param(0.1, 0.0, 1.0, "largest offset")},
                False,
                _shift,
            ),
            TransformSpec(
                "scale_intensity",
                "multiply the image by 1 + a factor drawn from [-factor, factor]; masks "
                "unchanged (MONAI RandScaleIntensity)",
                {"prob": _PROB, "factor": Param(0.1, 0.0, 1.0, "largest change of scale")},
                False,
                _scale,
            ),
        )
    }
)

Augmentation = tuple[Mapping[str, Any], ...]


def describe_augmentations() -> list[dict[str, Any]]:
    """Every transform as the API and the dashboard show it (``GET /api/augmentations/``):
    name, one line, and each parameter's default."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "params": {name: param.default for name, param in spec.params.items()},
        }
        for spec in TRANSFORMS.values()
    ]


def augmentation_problems(
    items: object, *, input_shape: Sequence[int] | None = None
) -> tuple[Augmentation, list[str]]:
    """Check a job's augmentation list; return it normalised (each item a read-only
    mapping with every parameter, defaults filled in) and every problem found.

    Args:
        items: the JSON form, a list of objects.
        input_shape: the job's ``(C, H, W[, D])`` when known: a flip's axis must be one of
            its spatial axes, and ``rotate90`` needs square ``(H, W)``.
    """
    if not isinstance(items, list | tuple):
        return (), [f"must be a list of transforms, got {items!r}"]
    if len(items) > MAX_TRANSFORMS:
        return (), [f"at most {MAX_TRANSFORMS} transforms, got {len(items)}"]
    normal: list[Mapping[str, Any]] = []
    problems: list[str] = []
    for index, item in enumerate(items):
        where = f"item {index}"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            problems.append(f"{where}: must be an object with a transform's name, got {item!r}")
            continue
        spec = TRANSFORMS.get(item["name"])
        if spec is None:
            problems.append(
                f"{where}: unknown transform {item['name']!r}; known: {', '.join(TRANSFORMS)}"
            )
            continue
        where = f"{where} ({spec.name})"
        values: dict[str, Any] = {"name": spec.name}
        for key in item:
            if key != "name" and key not in spec.params:
                takes = ", ".join(spec.params)
                problems.append(f"{where}: unknown parameter {key!r} (it takes {takes})")
        for name, param in spec.params.items():
            value = item.get(name, param.default)
            if not _fits(value, param):
                kind = "an integer" if param.integer else "a number"
                problems.append(
                    f"{where}: {name} must be {kind} in [{param.low}, {param.high}], got {value!r}"
                )
                continue
            values[name] = int(value) if param.integer else float(value)
        problems.extend(_shape_problems(where, values, input_shape))
        normal.append(MappingProxyType(values))
    return tuple(normal), problems


def check_augmentation(items: object, *, input_shape: Sequence[int] | None = None) -> Augmentation:
    """:func:`augmentation_problems`'s normal form, or an error.

    Raises:
        AugmentationError: every problem of ``items``.
    """
    normal, problems = augmentation_problems(items, input_shape=input_shape)
    if problems:
        raise AugmentationError(problems)
    return normal


def augmentation_json(augmentation: Augmentation) -> list[dict[str, Any]]:
    """The JSON form of a normalised list (what :func:`check_augmentation` reads back)."""
    return [dict(item) for item in augmentation]


def step_seed(seed: int, round_: int, hospital: int, step: int) -> int:
    """The seed of one step's draws, from the job's seed and where the step falls: the
    same on every party and in every process, whatever ran before it."""
    digest = hashlib.sha256(f"medsplit-augment:{seed}:{round_}:{hospital}:{step}".encode())
    return int.from_bytes(digest.digest()[:4], "big")  # numpy's RandomState takes 32 bits


def augment_batch(
    augmentation: Augmentation, x: torch.Tensor, y: torch.Tensor, *, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch with ``augmentation`` applied to each sample, every draw from ``seed``
    (:func:`step_seed`); ``(x, y)`` themselves when the list is empty.

    Args:
        augmentation: a normalised list (:func:`check_augmentation`).
        x: images ``(N, C, H, W[, D])``.
        y: class labels ``(N,)``, left as they are, or masks ``(N, 1, H, W[, D])`` or
            ``(N, H, W[, D])``, moved with their images and kept in their dtype.

    Raises:
        ConfigError: a flip along an axis the images lack, ``rotate90`` of images that
            are not square, or ``y`` of another shape.
    """
    if not augmentation or len(x) == 0:
        return x, y
    spatial = tuple(x.shape[2:])
    dims = len(spatial)
    if dims not in (2, 3):
        raise ConfigError(f"augmentation takes images (N, C, H, W[, D]), got {list(x.shape)}")
    mask = _mask_form(x, y)
    problems = _shape_problems("augmentation", augmentation, (x.shape[1], *spatial))
    if problems:
        raise ConfigError("; ".join(problems))
    transform = Compose([TRANSFORMS[item["name"]].build(item, dims) for item in augmentation])
    transform.set_random_state(seed=seed)  # explicit: MONAI's global determinism unused
    images, masks = [], []
    for i in range(len(x)):
        sample = {_IMAGE: x[i]}
        if mask is not None:
            sample[_MASK] = mask[i]
        out = transform(sample)
        images.append(convert_to_tensor(out[_IMAGE], track_meta=False).to(x.dtype))
        if mask is not None:
            masks.append(convert_to_tensor(out[_MASK], track_meta=False).round().to(y.dtype))
    x_out = torch.stack(images).contiguous()
    if mask is None:
        return x_out, y
    return x_out, torch.stack(masks).reshape(y.shape).contiguous()


def _mask_form(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """``y`` as channel-first masks ``(N, 1, ...)``, or ``None`` for class labels."""
    spatial = tuple(x.shape[2:])
    if y.dim() == 1 and len(y) == len(x):
        return None
    if len(y) == len(x) and tuple(y.shape[1:]) == spatial:
        return y.unsqueeze(1)
    if len(y) == len(x) and tuple(y.shape[1:]) == (1, *spatial):
        return y
    raise ConfigError(
        f"augmentation takes class labels (N,) or masks (N, 1, ...) or (N, ...) of the "
        f"images' size {list(spatial)}; got targets {list(y.shape)} for images {list(x.shape)}"
    )


def _fits(value: object, param: Param) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if param.integer and not isinstance(value, int):
        return False
    return math.isfinite(value) and param.low <= value <= param.high


def _shape_problems(
    where: str, items: Mapping[str, Any] | Augmentation, input_shape: Sequence[int] | None
) -> list[str]:
    """What of ``items`` (one item, or a list) the images' shape rules out."""
    if input_shape is None or len(input_shape) < 3:
        return []
    dims = len(input_shape) - 1
    problems = []
    for item in [items] if isinstance(items, Mapping) else items:
        axis = item.get("axis")
        if item.get("name") == "flip" and isinstance(axis, int) and axis >= dims:
            problems.append(
                f"{where}: flip axis {axis} is not one of the images' {dims} spatial "
                f"axes (0..{dims - 1})"
            )
        if item.get("name") == "rotate90" and input_shape[1] != input_shape[2]:
            problems.append(
                f"{where}: rotate90 needs square images, not H x W "
                f"{input_shape[1]} x {input_shape[2]}"
            )
    return problems
