"""Where a hospital's images come from: a MedMNIST archive, a folder, or synthetic data
(and, for vertical jobs only, a ``table`` of numeric features: :mod:`.vertical`).

Folder images are read through MONAI's ``LoadImage`` with the reader their suffix calls
for: Pillow for PNG/JPEG, pydicom for DICOM (``.dcm``), nibabel for NIfTI (``.nii``,
``.nii.gz``). Every image comes out channels first: ``(C, H, W)`` (``C = 1`` for grey,
3 for colour) or ``(C, H, W, D)`` for volumes, with intensities scaled per image to
[0, 1]. PNG/JPEG and DICOM keep the row-major ``(rows, columns)`` order of MedMNIST
(MONAI's readers would otherwise swap the two axes); NIfTI keeps the order it is stored in.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from monai.data import ImageReader, NibabelReader, PILReader, PydicomReader
from monai.transforms import LoadImage, Resize, ScaleIntensity
from monai.utils import convert_to_tensor

from hospital_agent.data.problems import DataProblem, Problems
from medsplit.data import (
    DataSplit,
    load_medmnist,
    synthetic_segmentation_split,
    synthetic_split,
)
from medsplit.errors import ConfigError, DataError
from medsplit.training.tasks import TASKS

KINDS = ("medmnist", "folder", "synthetic", "table")
#: What a hospital's data is for: a label per image, or a mask per image (the tasks).
DATA_TASKS = tuple(TASKS)
#: The kinds that hold masks (a folder of images and masks, or synthetic ones).
SEGMENTATION_KINDS = ("folder", "synthetic")
#: Kinds only vertical jobs read (:mod:`hospital_agent.data.vertical`).
VERTICAL_ONLY = ("table",)
DEFAULT_ID_COLUMN = "id"
CSV_HEADER = ("file", "label")
DEFAULT_LABELS_CSV = "labels.csv"

_PIL_SUFFIXES = (".png", ".jpg", ".jpeg")
_DICOM_SUFFIXES = (".dcm",)
_NIFTI_SUFFIXES = (".nii", ".nii.gz")


@dataclass(frozen=True)
class DataSource:
    """Where a hospital's training pool comes from (the agent's configuration).

    Attributes:
        kind: ``"medmnist"``, ``"folder"``, ``"synthetic"`` or (vertical jobs only)
            ``"table"``.
        path: medmnist: the ``.npz`` archive; folder: the folder of images; table: the
            CSV of identifiers and numeric features.
        split: medmnist only: which split of the archive is the hospital's pool
            (``"train"``, ``"val"`` or ``"test"``).
        labels_csv: folder, classification only: the CSV of labels, header
            ``file,label``, one row per image (its name relative to the folder, an integer
            label). Relative paths are taken inside the folder; defaults to
            ``labels.csv`` there.
        samples, num_classes, shape, seed: synthetic only, as
            :func:`medsplit.data.synthetic_split` (``shape`` is ``(C, H, W)`` or
            ``(C, D, H, W)``).
        identifiers_csv: medmnist, vertical jobs: a CSV with the header ``id`` and one
            identifier per image of ``split``, in order (relative: next to the archive).
        id_column, feature_columns, label_column: table only: the identifier column, the
            feature columns (comma separated; every other column when unset) and the
            optional integer label column.
        task: ``"classification"`` (a label per image) or ``"segmentation"`` (a mask per
            image: a folder's ``images/`` and ``masks/``, or ``masks_csv``; synthetic:
            MONAI's generated images with masks, ``num_classes`` classes with the
            background; see :mod:`hospital_agent.data.masks`).
        masks_csv: folder, segmentation only (others ignore it): the CSV of pairs, header
            ``image,mask`` (names relative to the folder); unset: ``images/`` and
            ``masks/`` pair by name.

    Raises:
        ConfigError: an unknown kind, or a field the kind needs is missing or invalid.
    """

    kind: Literal["medmnist", "folder", "synthetic", "table"]
    path: str | os.PathLike[str] | None = None
    split: str = "train"
    labels_csv: str | os.PathLike[str] | None = None
    samples: int = 0
    num_classes: int = 2
    shape: tuple[int, ...] = (1, 28, 28)
    seed: int = 0
    identifiers_csv: str | os.PathLike[str] | None = None
    id_column: str = DEFAULT_ID_COLUMN
    feature_columns: str | None = None
    label_column: str | None = None
    task: Literal["classification", "segmentation"] = "classification"
    masks_csv: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.task not in DATA_TASKS:
            raise ConfigError(f"task must be one of {', '.join(DATA_TASKS)}, got {self.task!r}")
        if self.task == "segmentation" and self.kind not in SEGMENTATION_KINDS:
            raise ConfigError(
                f"a {self.kind} source holds no masks; a segmentation set is a folder "
                f"(images/ and masks/, or masks_csv) or synthetic"
            )
        if self.kind in ("medmnist", "folder", "table") and not self.path:
            raise ConfigError(f"a {self.kind} source needs a path")
        if self.kind == "synthetic" and (
            not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1
        ):
            raise ConfigError(f"a synthetic source needs samples >= 1, got {self.samples!r}")

    @property
    def segmentation(self) -> bool:
        """It holds a mask per image."""
        return self.task == "segmentation"

    def masks_path(self) -> Path | None:
        """Segmentation folders: the CSV of pairs, or ``None`` (``images/``, ``masks/``)."""
        if self.masks_csv is None or self.path is None:
            return None
        return Path(self.path) / self.masks_csv

    def labels_path(self) -> Path:
        """Folder sources: where the labels CSV is."""
        if self.path is None:
            raise ConfigError(f"a {self.kind} source has no folder")
        return Path(self.path) / (self.labels_csv or DEFAULT_LABELS_CSV)


@dataclass(frozen=True)
class Loaded:
    """A source as read: the pool, and one image's shape before any resizing (the most
    common shape when a folder's images differ)."""

    split: DataSplit
    image_shape: tuple[int, ...]


def load_source(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> DataSplit:
    """Read the hospital's whole training pool.

    Args:
        source: where the data is.
        input_shape: the job's ``(C, H, W[, D])``. Needed only when a folder's images
            differ in size (each is then resized to it as it is read); when given, images
            whose channels or number of dimensions do not fit it are problems.
        num_classes: when given, labels outside ``0..num_classes-1`` are problems.

    Returns:
        float32 images ``(N, C, *spatial)`` in [0, 1] and int64 labels ``(N,)``; a
        segmentation set (masks) is read by :func:`~hospital_agent.data.load_local`.

    Raises:
        DataProblem: everything found wrong (up to a handful, each naming its file).
        ConfigError: ``input_shape`` or ``num_classes`` is malformed.
    """
    return read_source(source, input_shape=input_shape, num_classes=num_classes).split


def read_source(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> Loaded:
    """As :func:`load_source`, also returning the image shape as loaded."""
    check_job(input_shape, num_classes)
    if source.kind in VERTICAL_ONLY:
        raise DataProblem.one(
            os.fspath(source.path or ""),
            f"a {source.kind} source holds a vertical party's features; only vertical jobs "
            "read it (hospital_agent.data.vertical)",
        )
    if source.segmentation:
        # Masks are read by hospital_agent.data.masks, which builds on this module.
        raise ConfigError(
            "a segmentation source is read with its masks by hospital_agent.data.load_local "
            "(or check_data), not load_source"
        )
    if source.kind == "medmnist":
        loaded = _read_medmnist(source)
    elif source.kind == "synthetic":
        loaded = _read_synthetic(source)
    else:
        loaded = _read_folder(source, input_shape=input_shape, num_classes=num_classes)
    problems = Problems()
    where = None if source.kind == "synthetic" else os.fspath(source.path or "")
    if source.kind != "folder":  # folders check before resizing
        _check_fit(loaded.image_shape, input_shape, where, problems)
    if num_classes is not None and source.kind != "folder":  # folders check per row
        bad = torch.nonzero(
            (loaded.split.labels < 0) | (loaded.split.labels >= num_classes)
        ).flatten()
        for index in bad[:5].tolist():
            label = int(loaded.split.labels[index])
            problems.add(where, f"label {label} of item {index} is outside {_classes(num_classes)}")
        if len(bad) > 5:
            problems.add(where, f"{len(bad) - 5} more labels are outside {_classes(num_classes)}")
    problems.raise_if_any()
    return loaded


def check_job(input_shape: tuple[int, ...] | None, num_classes: int | None) -> None:
    """Refuse a malformed job input shape or class count.

    Raises:
        ConfigError: naming the value.
    """
    if input_shape is not None and (
        not isinstance(input_shape, tuple | list)
        or len(input_shape) not in (3, 4)
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in input_shape)
    ):
        raise ConfigError(
            f"input_shape must be (C, H, W) or (C, H, W, D) of positive integers, "
            f"got {input_shape!r}"
        )
    if num_classes is not None and (
        not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2
    ):
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")


def _classes(num_classes: int) -> str:
    return f"the job's classes 0..{num_classes - 1}"


def _check_fit(
    shape: tuple[int, ...],
    input_shape: tuple[int, ...] | None,
    where: str | None,
    problems: Problems,
) -> None:
    if input_shape is None or not shape:
        return
    if len(shape) != len(input_shape):
        problems.add(
            where,
            f"images are {len(shape) - 1}-D {list(shape)} but the job expects "
            f"{len(input_shape) - 1}-D {list(input_shape)}; they cannot be resized to it",
        )
    elif shape[0] != input_shape[0]:
        problems.add(
            where,
            f"images have {shape[0]} channel(s) {list(shape)} but the job expects "
            f"{input_shape[0]} {list(input_shape)}",
        )


# -- medmnist and synthetic -------------------------------------------------------------


def _read_medmnist(source: DataSource) -> Loaded:
    name = os.fspath(source.path or "")
    try:
        split = load_medmnist(name, split=source.split)
    except DataError as e:
        message = str(e)
        reason = message.removeprefix(f"{name}: ")
        raise DataProblem.one(name, reason) from e
    return Loaded(split, tuple(split.images.shape[1:]))


def _read_synthetic(source: DataSource) -> Loaded:
    try:
        if source.segmentation:
            split = synthetic_segmentation_split(
                source.samples,
                shape=tuple(source.shape),
                num_classes=source.num_classes,
                seed=source.seed,
            )
            return Loaded(split, tuple(split.images.shape[1:]))
        split = synthetic_split(
            source.samples,
            shape=tuple(source.shape),
            num_classes=source.num_classes,
            seed=source.seed,
        )
    except ConfigError as e:
        raise DataProblem.one(None, f"synthetic source: {e}") from e
    return Loaded(split, tuple(split.images.shape[1:]))


# -- folders --------------------------------------------------------------------------


def reader_for(path: str | os.PathLike[str]) -> ImageReader | None:
    """The MONAI reader for an image file, by suffix; ``None`` for an unsupported one."""
    name = os.fspath(path).lower()
    if name.endswith(_PIL_SUFFIXES):
        return PILReader(reverse_indexing=False)
    if name.endswith(_DICOM_SUFFIXES):
        return PydicomReader(swap_ij=False)
    if name.endswith(_NIFTI_SUFFIXES):
        return NibabelReader()
    return None


def _kind_of(name: str) -> str:
    name = name.lower()
    if name.endswith(_PIL_SUFFIXES):
        return "PNG/JPEG"
    return "DICOM" if name.endswith(_DICOM_SUFFIXES) else "NIfTI"


def read_image(path: str | os.PathLike[str]) -> torch.Tensor:
    """Read one image file channels first, float32, as stored (not yet scaled).

    Raises:
        DataProblem: unsupported suffix, unreadable or corrupt file, not 2-D or 3-D, or
            values that are not finite. The message names the file.
    """
    name = os.fspath(path)
    reader = reader_for(name)
    if reader is None:
        supported = ", ".join(_PIL_SUFFIXES + _DICOM_SUFFIXES + _NIFTI_SUFFIXES)
        raise DataProblem.one(name, f"unsupported file type; expected one of {supported}")
    if not Path(name).is_file():
        raise DataProblem.one(name, "no such file")
    loader = LoadImage(reader=reader, image_only=True, ensure_channel_first=True, dtype=np.float32)
    try:
        image = loader(name)
    except Exception as e:  # readers raise anything from OSError to struct.error
        # Only the exception's type: reader messages can quote the file's content.
        cause = e.__cause__ or e
        raise DataProblem.one(
            name, f"cannot be read as a {_kind_of(name)} image ({type(cause).__name__})"
        ) from e
    image = convert_to_tensor(image, track_meta=False).to(torch.float32)  # plain: no metadata
    if image.dim() not in (3, 4):
        raise DataProblem.one(
            name,
            f"has shape {list(image.shape)} (channels first); expected a 2-D or 3-D image",
        )
    if image.numel() == 0:
        raise DataProblem.one(name, f"holds no pixels (shape {list(image.shape)})")
    if not torch.isfinite(image).all():
        raise DataProblem.one(name, "holds NaN or infinite values")
    return image.contiguous()


def _read_labels(source: DataSource, problems: Problems) -> list[tuple[int, str, int]]:
    """``(csv row number, file name, label)`` for each well-formed row."""
    csv_path = source.labels_path()
    csv_name = os.fspath(csv_path)
    if not csv_path.is_file():
        reason = "no such labels file" if not csv_path.exists() else "not a file"
        if source.masks_csv:  # masks_csv is read by segmentation sets only
            reason += " (masks_csv is set: for a segmentation set, set task = segmentation)"
        problems.add(csv_name, reason)
        return []
    rows: list[tuple[int, str, int]] = []
    seen: dict[str, int] = {}
    for number, where, file, text in two_column_rows(csv_path, CSV_HEADER, problems):
        try:
            label = int(text)
        except ValueError:
            problems.add(csv_name, f"{where}: the label is not an integer")
            continue
        if not file:
            problems.add(csv_name, f"{where}: no file name")
            continue
        if Path(file).is_absolute() or ".." in Path(file).parts:
            problems.add(csv_name, f"{where}: {file!r} must be a name inside the folder")
            continue
        if file in seen:
            problems.add(csv_name, f"{where}: {file!r} is listed again (row {seen[file]})")
            continue
        seen[file] = number
        rows.append((number, file, label))
    return rows


def two_column_rows(
    csv_path: Path, header: tuple[str, str], problems: Problems
) -> Iterator[tuple[int, str, str, str]]:
    """``(row number, where, first, second)`` of each non-blank row of a two-column CSV
    whose first row is ``header``, cells stripped, in file order (so the caller's problems
    and these stay in row order); a wrong header, a row of another width or a file that
    cannot be read is a problem added here."""
    csv_name = os.fspath(csv_path)
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            first = next(reader, None)
            if first is None or tuple(c.strip().lower() for c in first) != header:
                problems.add(csv_name, f"the first row must be the header {','.join(header)}")
                return
            for fields in reader:
                number = reader.line_num
                if not fields or all(not c.strip() for c in fields):
                    continue
                where = f"{csv_path.name} row {number}"
                if len(fields) != 2:
                    problems.add(csv_name, f"{where}: expected 2 columns, got {len(fields)}")
                    continue
                yield number, where, fields[0].strip(), fields[1].strip()
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        problems.add(csv_name, f"cannot be read as a CSV file ({type(e).__name__})")


def _read_folder(
    source: DataSource, *, input_shape: tuple[int, ...] | None, num_classes: int | None
) -> Loaded:
    folder = Path(source.path or "")
    problems = Problems()
    if not folder.is_dir():
        problems.add(os.fspath(folder), "no such folder" if not folder.exists() else "not a folder")
        problems.raise_if_any()
    rows = _read_labels(source, problems)
    csv_name = source.labels_path().name
    images: list[torch.Tensor] = []
    labels: list[int] = []
    names: list[str] = []
    for number, file, label in rows:
        path = os.fspath(folder / file)
        if label < 0 or (num_classes is not None and label >= num_classes):
            allowed = _classes(num_classes) if num_classes is not None else "labels >= 0"
            problems.add(path, f"{csv_name} row {number}: label {label} is outside {allowed}")
        if not Path(path).exists():
            problems.add(path, f"listed in {csv_name} row {number} but no such file")
            continue
        try:
            image = read_image(path)
        except DataProblem as e:
            problems.add(e.file, e.reason)
            continue
        images.append(image)
        labels.append(label)
        names.append(path)
    if not rows and not problems:
        problems.add(os.fspath(source.labels_path()), "lists no images: the dataset is empty")
    shape = _common_shape(images, names, input_shape, problems)
    if shape is not None:
        _check_fit(shape, input_shape, os.fspath(folder), problems)
    problems.raise_if_any()
    if shape is None:  # only reachable when nothing was read, which is a problem above
        raise DataProblem.one(os.fspath(folder), "no images could be read")
    if input_shape is not None and any(tuple(im.shape) != shape for im in images):
        resize = Resize(tuple(input_shape[1:]), mode=_mode(len(input_shape) - 1))
        images = [convert_to_tensor(resize(im), track_meta=False) for im in images]
    scale = ScaleIntensity(minv=0.0, maxv=1.0)
    stacked = torch.stack(
        [convert_to_tensor(scale(im), track_meta=False).to(torch.float32) for im in images]
    )
    split = DataSplit(images=stacked.contiguous(), labels=torch.tensor(labels, dtype=torch.int64))
    return Loaded(split, shape)


def _mode(spatial_dims: int) -> str:
    return "bilinear" if spatial_dims == 2 else "trilinear"


def _common_shape(
    images: list[torch.Tensor],
    names: list[str],
    input_shape: tuple[int, ...] | None,
    problems: Problems,
) -> tuple[int, ...] | None:
    """The most common image shape; a problem for each image that cannot join it."""
    if not images:
        return None
    shapes = [tuple(im.shape) for im in images]
    common = Counter(shapes).most_common(1)[0][0]
    for name, shape in zip(names, shapes, strict=True):
        if shape == common:
            continue
        if len(shape) != len(common) or shape[0] != common[0]:
            problems.add(
                name,
                f"shape {list(shape)} has other channels or dimensions than the others "
                f"{list(common)}; it cannot be resized to match",
            )
        elif input_shape is None:
            problems.add(
                name,
                f"shape {list(shape)} differs from the others {list(common)}; give the job's "
                "input shape to resize all images to it",
            )
    return common
