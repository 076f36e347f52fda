"""A hospital's segmentation set: images with their masks, read and checked before a turn.

A ``folder`` source with ``task = "segmentation"`` holds either

- ``images/`` and ``masks/``: an image and its mask share a file name
  (``images/case01.png`` and ``masks/case01.png``); or
- a CSV (``masks_csv``, header ``image,mask``) naming each image and its mask, relative
  to the folder.

Files are PNG/JPEG, DICOM or NIfTI, read by MONAI's ``LoadImage`` as images are
(:func:`hospital_agent.data.sources.read_image`). A mask is one channel of integer class
indices ``0..num_classes-1`` (0 the background) of its image's spatial shape. It is kept
as int64 ``(1, *spatial)``, channels first like its image, as MONAI's Dice losses take a
target of class indices; resizing a mask (to the job's shape) is nearest-neighbour, so
it keeps its classes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import torch
from monai.transforms import Resize, ScaleIntensity
from monai.utils import convert_to_tensor

from hospital_agent.data.problems import DataProblem, Problems
from hospital_agent.data.sources import (
    DataSource,
    Loaded,
    _check_fit,
    _common_shape,
    _mode,
    _read_synthetic,
    check_job,
    read_image,
    two_column_rows,
)
from medsplit.data import DataSplit

IMAGES_DIR = "images"
MASKS_DIR = "masks"
MASKS_CSV_HEADER = ("image", "mask")
#: How many masks' class problems one error lists before it only counts them.
_MAX_CLASS_PROBLEMS = 5


def read_segmentation_source(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> Loaded:
    """A segmentation source's pool, as :func:`~hospital_agent.data.sources.read_source`
    reads a classification one: a folder of images and masks, or synthetic ones.

    Raises:
        DataProblem: every problem found, each naming its file (see
            :func:`read_segmentation_folder`); synthetic masks of classes beyond the job's.
        ConfigError: ``input_shape`` or ``num_classes`` is malformed.
    """
    check_job(input_shape, num_classes)
    if source.kind == "folder":
        split, shape = read_segmentation_folder(
            Path(source.path or ""),
            source.masks_path(),
            input_shape=input_shape,
            num_classes=num_classes,
            labels_csv=source.labels_csv is not None,
        )
        return Loaded(split, shape)
    loaded = _read_synthetic(source)
    problems = Problems()
    _check_fit(loaded.image_shape, input_shape, None, problems)
    if num_classes is not None:
        check_mask_classes(loaded.split.labels, [None] * len(loaded.split), num_classes, problems)
    problems.raise_if_any()
    return loaded


def read_mask(path: str | os.PathLike[str]) -> torch.Tensor:
    """Read one mask file: int64 ``(1, *spatial)`` class indices, as stored.

    Raises:
        DataProblem: the file cannot be read as an image (see ``read_image``), has more
            than one channel, or holds values that are not whole numbers >= 0. The message
            names the file and never holds a pixel value but the offending class.
    """
    name = os.fspath(path)
    raw = read_image(name)
    if raw.shape[0] != 1:
        raise DataProblem.one(
            name,
            f"a mask has one channel of class indices; this one has {raw.shape[0]} "
            f"(shape {list(raw.shape)}, channels first)",
        )
    if not torch.equal(raw, raw.round()):
        raise DataProblem.one(
            name, "holds values that are not whole numbers; a mask holds class indices"
        )
    if float(raw.min()) < 0:
        raise DataProblem.one(name, f"holds the negative class {int(raw.min())}")
    return raw.to(torch.int64).contiguous()


def mask_classes(masks: torch.Tensor) -> dict[int, int]:
    """In how many masks each class appears (the classes present, ascending):
    what a segmentation set's heartbeat tells instead of per-label counts."""
    counts: Counter[int] = Counter()
    for mask in masks:
        counts.update(int(c) for c in torch.unique(mask).tolist())
    return dict(sorted(counts.items()))


def check_mask_classes(
    masks: torch.Tensor, names: list[str | None], num_classes: int, problems: Problems
) -> None:
    """A problem for each mask (naming its file) holding a class outside
    ``0..num_classes-1``; after a handful, the rest are only counted."""
    bad = 0
    for mask, name in zip(masks, names, strict=True):
        high = int(mask.max()) if mask.numel() else 0
        if high < num_classes:
            continue
        bad += 1
        if bad <= _MAX_CLASS_PROBLEMS:
            problems.add(
                name,
                f"mask holds class {high}, outside the job's classes 0..{num_classes - 1} "
                "(a mask's values are class indices; 0/255 masks need converting to 0/1)",
            )
    if bad > _MAX_CLASS_PROBLEMS:
        problems.add(None, f"{bad - _MAX_CLASS_PROBLEMS} more masks hold classes outside the job's")


def _pairs_from_folders(
    folder: Path, problems: Problems, *, labels_csv: bool = False
) -> list[tuple[str, str]]:
    """``(image, mask)`` paths of the files that ``images/`` and ``masks/`` share."""
    images_dir, masks_dir = folder / IMAGES_DIR, folder / MASKS_DIR
    for sub in (images_dir, masks_dir):
        if not sub.is_dir():
            reason = (
                f"no such folder: a segmentation folder holds {IMAGES_DIR}/ and {MASKS_DIR}/ "
                "(an image and its mask share a file name), or give masks_csv"
            )
            if labels_csv:  # read by classification sets only
                reason += " (labels_csv is set: for a set of labels, leave task unset)"
            problems.add(os.fspath(sub), reason)
    if problems:
        return []
    images = {p.name for p in images_dir.iterdir() if p.is_file() and not p.name.startswith(".")}
    masks = {p.name for p in masks_dir.iterdir() if p.is_file() and not p.name.startswith(".")}
    for name in sorted(images - masks):
        problems.add(os.fspath(images_dir / name), f"has no mask of that name in {MASKS_DIR}/")
    for name in sorted(masks - images):
        problems.add(os.fspath(masks_dir / name), f"has no image of that name in {IMAGES_DIR}/")
    both = sorted(images & masks)
    return [(os.fspath(images_dir / n), os.fspath(masks_dir / n)) for n in both]


def _pairs_from_csv(folder: Path, csv_path: Path, problems: Problems) -> list[tuple[str, str]]:
    """``(image, mask)`` paths of each well-formed row of the CSV ``image,mask``."""
    csv_name = os.fspath(csv_path)
    if not csv_path.is_file():
        problems.add(csv_name, "no such masks file" if not csv_path.exists() else "not a file")
        return []
    pairs: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for number, where, image, mask in two_column_rows(csv_path, MASKS_CSV_HEADER, problems):
        if not image or not mask:
            problems.add(csv_name, f"{where}: an image and a mask file are both needed")
            continue
        outside = [p for p in (image, mask) if Path(p).is_absolute() or ".." in Path(p).parts]
        if outside:
            problems.add(csv_name, f"{where}: {outside[0]!r} must be a name inside the folder")
            continue
        if image in seen:
            problems.add(csv_name, f"{where}: {image!r} is listed again (row {seen[image]})")
            continue
        seen[image] = number
        pairs.append((os.fspath(folder / image), os.fspath(folder / mask)))
    return pairs


def read_segmentation_folder(
    folder: Path,
    masks_csv: Path | None,
    *,
    input_shape: tuple[int, ...] | None,
    num_classes: int | None,
    labels_csv: bool = False,
) -> tuple[DataSplit, tuple[int, ...]]:
    """Read every image and its mask; check each mask against its image and the job.

    Returns:
        The pool (float32 images scaled per image to [0, 1], int64 masks
        ``(N, 1, *spatial)``) and one image's shape as loaded (the most common one).

    Raises:
        DataProblem: every problem found, each naming its file: a missing folder, CSV,
            image or mask; an unreadable file; a mask of more than one channel, of another
            spatial shape than its image, or of a class outside ``0..num_classes-1``;
            images that cannot be brought to one shape; an empty set.
    """
    problems = Problems()
    if not folder.is_dir():
        problems.add(os.fspath(folder), "no such folder" if not folder.exists() else "not a folder")
        problems.raise_if_any()
    if masks_csv is not None:
        pairs = _pairs_from_csv(folder, masks_csv, problems)
    else:
        pairs = _pairs_from_folders(folder, problems, labels_csv=labels_csv)
    images: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    names: list[str] = []
    mask_names: list[str | None] = []
    for image_path, mask_path in pairs:
        missing = [p for p in (image_path, mask_path) if not Path(p).exists()]
        for path in missing:
            problems.add(path, "listed but no such file")
        if missing:
            continue
        try:
            image = read_image(image_path)
            mask = read_mask(mask_path)
        except DataProblem as e:
            problems.add(e.file, e.reason)
            continue
        if tuple(mask.shape[1:]) != tuple(image.shape[1:]):
            problems.add(
                mask_path,
                f"mask is {list(mask.shape[1:])} but its image {Path(image_path).name} is "
                f"{list(image.shape[1:])}; a mask has its image's spatial shape",
            )
            continue
        images.append(image)
        masks.append(mask)
        names.append(image_path)
        mask_names.append(mask_path)
    if not pairs and not problems:
        where = masks_csv if masks_csv is not None else folder / IMAGES_DIR
        problems.add(os.fspath(where), "lists no images: the dataset is empty")
    if num_classes is not None and masks:
        for mask, name in zip(masks, mask_names, strict=True):
            check_mask_classes(mask.unsqueeze(0), [name], num_classes, problems)
    shape = _common_shape(images, names, input_shape, problems)
    if shape is not None:
        _check_fit(shape, input_shape, os.fspath(folder), problems)
    problems.raise_if_any()
    if shape is None:  # only reachable when nothing was read, which is a problem above
        raise DataProblem.one(os.fspath(folder), "no images could be read")
    if input_shape is not None and any(tuple(im.shape) != shape for im in images):
        spatial = tuple(input_shape[1:])
        resize_image = Resize(spatial, mode=_mode(len(spatial)))
        resize_mask = Resize(spatial, mode="nearest")
        images = [convert_to_tensor(resize_image(im), track_meta=False) for im in images]
        masks = [
            convert_to_tensor(resize_mask(m.float()), track_meta=False).round().to(torch.int64)
            for m in masks
        ]
    scale = ScaleIntensity(minv=0.0, maxv=1.0)
    stacked = torch.stack(
        [convert_to_tensor(scale(im), track_meta=False).to(torch.float32) for im in images]
    )
    split = DataSplit(
        images=stacked.contiguous(), labels=torch.stack(masks).to(torch.int64).contiguous()
    )
    return split, shape
