"""A vertical party's records: one identifier per patient, its features, maybe its label.

In vertical split learning each party holds other features of the same patients. The
agent reads them as:

- images with an identifier each: a ``folder`` (identifier = the file's name up to its
  first ``.``, as :func:`medsplit.psi.identifiers_from_files` names it; labels from the
  labels CSV when there is one, else every image file of the folder, unlabelled) or a
  ``medmnist`` archive with ``identifiers_csv`` (header ``id``, one row per image of the
  split, in order: MedMNIST itself carries no identifiers);
- a ``table``: a CSV of an identifier column, numeric feature columns and, at the label
  party, an integer label column.

Everything is checked before any training: duplicate or malformed identifiers (by
:func:`medsplit.psi.check_identifiers`' rules), missing or non-numeric feature cells, a
label that is not an integer, row counts that disagree. Errors are :class:`DataProblem`
naming the file and row, never a value of a feature.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from monai.transforms import Resize, ScaleIntensity
from monai.utils import convert_to_tensor

from hospital_agent.data.local import DataSummary
from hospital_agent.data.problems import DataProblem, Problems
from hospital_agent.data.sources import (
    DataSource,
    _common_shape,
    _mode,
    _read_labels,
    check_job,
    read_image,
    read_source,
    reader_for,
)
from medsplit.psi import check_identifiers
from medsplit.psi.errors import IdentifierError

__all__ = ["VerticalRecords", "identifier_of", "load_vertical"]

VERTICAL_KINDS = ("medmnist", "folder", "table")


@dataclass(frozen=True)
class VerticalRecords:
    """A party's records, one row per identifier, in the order of its files.

    Attributes:
        identifiers: the records' identifiers (distinct, well formed).
        features: batch first: images ``(N, C, H, W[, D])`` float32 in [0, 1], or table
            rows ``(N, F)`` float32.
        labels: int64 ``(N,)`` at a labelled party, else ``None``.
    """

    identifiers: tuple[str, ...]
    features: torch.Tensor
    labels: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.features.shape[0] != len(self.identifiers):
            raise ValueError(
                f"{self.features.shape[0]} feature rows for {len(self.identifiers)} identifiers"
            )
        if self.labels is not None and tuple(self.labels.shape) != (len(self.identifiers),):
            raise ValueError(
                f"labels of shape {list(self.labels.shape)} for {len(self.identifiers)} records"
            )

    def __len__(self) -> int:
        return len(self.identifiers)

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """One record's features: ``(C, H, W[, D])`` or ``(F,)``."""
        return tuple(self.features.shape[1:])

    def summary(self) -> DataSummary:
        """Counts and shapes only, never an identifier: the heartbeat's
        ``dataset_summary`` (``label_counts`` is empty at an unlabelled party; every
        record counts as ``train``: the parties split the aligned records together)."""
        counts = {}
        if self.labels is not None:
            counts = {str(k): v for k, v in label_counts_of(self.labels).items()}
        return DataSummary(
            image_shape=list(self.feature_shape),
            label_counts=counts,
            split_sizes={"train": len(self), "val": 0},
        )

    def rows(self, positions: Sequence[int]) -> VerticalRecords:
        """The records at ``positions`` (an alignment's), in that order."""
        index = torch.tensor(list(positions), dtype=torch.int64)
        return VerticalRecords(
            tuple(self.identifiers[i] for i in positions),
            self.features[index].contiguous(),
            None if self.labels is None else self.labels[index].contiguous(),
        )


def label_counts_of(labels: torch.Tensor) -> dict[int, int]:
    values, counts = torch.unique(labels, return_counts=True)
    return {int(v): int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)}


def identifier_of(file: str) -> str:
    """A file's identifier: its name up to the first ``.`` (``P0012.nii.gz`` is
    ``P0012``), as :func:`medsplit.psi.identifiers_from_files` names files."""
    return Path(file).name.split(".", 1)[0]


def load_vertical(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> VerticalRecords:
    """Read and check a vertical party's records.

    Args:
        source: a ``folder``, a ``medmnist`` archive with ``identifiers_csv``, or a ``table``.
        input_shape: images only, as :func:`hospital_agent.data.load_source`.
        num_classes: when given, labels outside ``0..num_classes-1`` are problems.

    Raises:
        DataProblem: everything found wrong (up to a handful), each naming file and row.
        ConfigError: ``input_shape`` or ``num_classes`` is malformed.
    """
    check_job(input_shape, num_classes)
    if source.kind not in VERTICAL_KINDS:
        raise DataProblem.one(
            None,
            f"a {source.kind} source has no identifiers; a vertical party reads "
            f"{', '.join(VERTICAL_KINDS)}",
        )
    if source.segmentation:
        raise DataProblem.one(
            os.fspath(source.path or ""),
            "a segmentation set (masks) cannot take part in a vertical job, whose parties "
            "hold features and labels per patient",
        )
    if source.kind == "table":
        return _read_table(source, num_classes=num_classes)
    if source.kind == "medmnist":
        return _read_medmnist(source, input_shape=input_shape, num_classes=num_classes)
    return _read_folder(source, input_shape=input_shape, num_classes=num_classes)


# -- identifiers ----------------------------------------------------------------------


def _check_ids(values: list[str], wheres: list[str], file: str, problems: Problems) -> None:
    """Duplicates by row, then :func:`check_identifiers`' rules for the first malformed."""
    first: dict[str, str] = {}
    unique: list[str] = []
    unique_wheres: list[str] = []
    for value, where in zip(values, wheres, strict=True):
        if value in first:
            problems.add(
                file,
                f"{where}: identifier {value[:40]!r} repeats {first[value]}; each record "
                "needs its own identifier",
            )
            continue
        first[value] = where
        unique.append(value)
        unique_wheres.append(where)
    if not unique:
        if not problems:
            problems.add(file, "no records: the dataset is empty")
        return
    try:
        check_identifiers(unique, source="identifiers")
    except IdentifierError as e:
        reason = str(e).split(": ", 1)[-1]
        where = unique_wheres[e.line - 1] if 1 <= e.line <= len(unique_wheres) else ""
        problems.add(file, f"{where}: {reason}" if where else reason)


# -- tables ---------------------------------------------------------------------------


def _read_table(source: DataSource, *, num_classes: int | None) -> VerticalRecords:
    path = Path(source.path or "")
    name = os.fspath(path)
    if not path.is_file():
        raise DataProblem.one(name, "no such file" if not path.exists() else "not a file")
    problems = Problems()
    ids: list[str] = []
    wheres: list[str] = []
    rows: list[list[float]] = []
    labels: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, strict=True)
            header = [c.strip() for c in next(reader, None) or []]
            id_at, feature_at, label_at = _table_columns(source, header, name)
            for fields in reader:
                number = reader.line_num
                if not fields or all(not c.strip() for c in fields):
                    continue
                where = f"row {number}"
                if len(fields) != len(header):
                    problems.add(
                        name, f"{where}: {len(fields)} columns where the header has {len(header)}"
                    )
                    continue
                values, bad = _numbers(fields, feature_at, header)
                if bad:
                    problems.add(name, f"{where}: {bad}")
                    continue
                if label_at is not None:
                    label, bad = _label(fields[label_at].strip(), num_classes)
                    if bad:
                        problems.add(name, f"{where}: column {header[label_at]!r}: {bad}")
                        continue
                    labels.append(label)
                ids.append(fields[id_at].strip())
                wheres.append(where)
                rows.append(values)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataProblem.one(name, f"cannot be read as a CSV file ({type(e).__name__})") from e
    _check_ids(ids, wheres, name, problems)
    problems.raise_if_any()
    return VerticalRecords(
        tuple(ids),
        torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(feature_at)),
        torch.tensor(labels, dtype=torch.int64) if label_at is not None else None,
    )


def _table_columns(
    source: DataSource, header: list[str], name: str
) -> tuple[int, list[int], int | None]:
    """The indices of the identifier, feature and label columns in ``header``."""
    if not header:
        raise DataProblem.one(name, "row 1: the file is empty; it needs a header row")

    def at(column: str, what: str) -> int:
        count = header.count(column)
        if count != 1:
            found = "twice" if count > 1 else "not"
            raise DataProblem.one(
                name, f"row 1: the {what} column {column!r} is {found} in the header"
            )
        return header.index(column)

    id_at = at(source.id_column, "identifier")
    label_at = at(source.label_column, "label") if source.label_column else None
    if source.feature_columns:
        wanted = [c.strip() for c in source.feature_columns.split(",") if c.strip()]
        feature_at = [at(c, "feature") for c in wanted]
    else:
        feature_at = [i for i in range(len(header)) if i not in (id_at, label_at)]
    if not feature_at:
        raise DataProblem.one(name, "row 1: the header names no feature column")
    if id_at in feature_at or (label_at is not None and label_at in feature_at):
        raise DataProblem.one(name, "row 1: the identifier or label column is listed as a feature")
    return id_at, feature_at, label_at


def _numbers(fields: list[str], columns: list[int], header: list[str]) -> tuple[list[float], str]:
    """The feature cells as floats, or what is wrong with the first that is not one (its
    column, never its value: a cell may hold data that must not leave the hospital)."""
    values = []
    for i in columns:
        text = fields[i].strip()
        if not text:
            return [], f"column {header[i]!r}: the feature is missing"
        try:
            value = float(text)
        except ValueError:
            return [], f"column {header[i]!r}: the feature is not a number"
        if not math.isfinite(value):
            return [], f"column {header[i]!r}: the feature is not finite"
        values.append(value)
    return values, ""


def _label(text: str, num_classes: int | None) -> tuple[int, str]:
    try:
        label = int(text)
    except ValueError:
        return 0, "the label is not an integer" if text else "the label is missing"
    if label < 0 or (num_classes is not None and label >= num_classes):
        allowed = f"0..{num_classes - 1}" if num_classes is not None else ">= 0"
        return 0, f"label {label} is outside the job's classes {allowed}"
    return label, ""


# -- medmnist -------------------------------------------------------------------------


def _identifiers_path(source: DataSource) -> Path:
    given = Path(source.identifiers_csv or "")
    return given if given.is_absolute() else Path(source.path or "").parent / given


def _read_medmnist(
    source: DataSource, *, input_shape: tuple[int, ...] | None, num_classes: int | None
) -> VerticalRecords:
    if not source.identifiers_csv:
        raise DataProblem.one(
            os.fspath(source.path or ""),
            "a MedMNIST archive holds no identifiers: give data.identifiers_csv (header "
            "id, one row per image of the split, in order)",
        )
    split = read_source(source, input_shape=input_shape, num_classes=num_classes).split
    path = _identifiers_path(source)
    name = os.fspath(path)
    if not path.is_file():
        raise DataProblem.one(name, "no such file" if not path.exists() else "not a file")
    problems = Problems()
    ids: list[str] = []
    wheres: list[str] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, strict=True)
            header = [c.strip() for c in next(reader, None) or []]
            if header != ["id"]:
                raise DataProblem.one(name, "row 1: the header must be the one column id")
            for fields in reader:
                if not fields or all(not c.strip() for c in fields):
                    continue
                where = f"row {reader.line_num}"
                if len(fields) != 1:
                    problems.add(name, f"{where}: {len(fields)} columns where the header has 1")
                    continue
                ids.append(fields[0].strip())
                wheres.append(where)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataProblem.one(name, f"cannot be read as a CSV file ({type(e).__name__})") from e
    count = len(split.labels)
    if not problems and len(ids) != count:
        problems.add(
            name,
            f"{len(ids):,} identifiers for the {count:,} images of split {source.split!r} "
            f"of {os.fspath(source.path or '')}: one row per image, in order",
        )
    _check_ids(ids, wheres, name, problems)
    problems.raise_if_any()
    return VerticalRecords(tuple(ids), split.images, split.labels)


# -- folders --------------------------------------------------------------------------


def _read_folder(
    source: DataSource, *, input_shape: tuple[int, ...] | None, num_classes: int | None
) -> VerticalRecords:
    folder = Path(source.path or "")
    if not folder.is_dir():
        raise DataProblem.one(
            os.fspath(folder), "no such folder" if not folder.exists() else "not a folder"
        )
    if source.labels_csv or source.labels_path().is_file():
        # A labelled party: the files the labels CSV lists, read as any folder is.
        problems = Problems()
        rows = _read_labels(source, problems)
        problems.raise_if_any()
        csv_name = source.labels_path().name
        ids = [identifier_of(file) for _, file, _ in rows]
        wheres = [f"{csv_name} row {number}" for number, _, _ in rows]
        _check_ids(ids, wheres, os.fspath(source.labels_path()), problems)
        problems.raise_if_any()
        split = read_source(source, input_shape=input_shape, num_classes=num_classes).split
        return VerticalRecords(tuple(ids), split.images, split.labels)
    files = sorted(
        p.name for p in folder.iterdir() if p.is_file() and reader_for(p.name) is not None
    )
    problems = Problems()
    _check_ids([identifier_of(f) for f in files], files, os.fspath(folder), problems)
    problems.raise_if_any()
    images: list[torch.Tensor] = []
    names: list[str] = []
    for file in files:
        try:
            images.append(read_image(folder / file))
            names.append(os.fspath(folder / file))
        except DataProblem as e:
            problems.add(e.file, e.reason)
    shape = _common_shape(images, names, input_shape, problems)
    problems.raise_if_any()
    if shape is None:
        raise DataProblem.one(os.fspath(folder), "no images could be read")
    # As a labelled folder: resized only when the images differ, to the job's shape.
    if input_shape is not None and any(tuple(im.shape) != shape for im in images):
        resize = Resize(tuple(input_shape[1:]), mode=_mode(len(input_shape) - 1))
        images = [convert_to_tensor(resize(im), track_meta=False) for im in images]
    scale = ScaleIntensity(minv=0.0, maxv=1.0)
    stacked = torch.stack(
        [convert_to_tensor(scale(im), track_meta=False).to(torch.float32) for im in images]
    )
    return VerticalRecords(tuple(identifier_of(f) for f in files), stacked.contiguous(), None)
