"""The hospital's local test set: where it comes from, reading it, and its summary.

A test set is held apart from the training pool (and its validation part) and is read
only to evaluate a completed job's final model through the split
(:mod:`medsplit.turns.evaluation`). Where it comes from, by the pool's kind:

- ``medmnist``: a split of the archive, ``data.test_split`` (by default ``test``, when
  the archive holds one), or of another archive (``data.test_path``);
- ``folder``: a folder of its own (``data.test_path``, with its ``labels.csv``, or
  ``images/`` and ``masks/`` for a segmentation set), or a CSV of its own
  (``data.test_labels_csv`` / ``data.test_masks_csv``) naming images of the pool's folder
  (or of ``data.test_path``) that the pool's CSV does not list;
- ``synthetic``: ``data.test_samples`` images drawn with the seed ``data.seed + 1``;
- ``table`` (vertical parties): none (vertical jobs are not evaluated through the split).

Only its size and counts per label (or, for masks, in how many masks each class appears)
leave the hospital, in the heartbeat's summary.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from hospital_agent.data.local import DataSummary, load_local
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.sources import DataSource
from hospital_agent.data.transforms import load_for_job
from medsplit.data import DataSplit
from medsplit.errors import ConfigError

#: What an agent without a test set reports, in words.
NO_TEST_SET = "no test set"
#: The archive split a MedMNIST pool's test set is when ``test_split`` is not set.
DEFAULT_TEST_SPLIT = "test"


@dataclass(frozen=True)
class TestSettings:
    """The ``data.test_*`` settings (see the module docstring).

    Attributes:
        enabled: ``False``: no test set whatever else is set.
        path: medmnist: another archive; folder: the test set's own folder.
        split: medmnist: the archive's split that is the test set (``None``: ``test``
            when the archive holds one, else no test set).
        labels_csv: folder, classification: the test set's CSV of labels.
        masks_csv: folder, segmentation: the test set's CSV of image,mask pairs.
        samples: synthetic: how many test images (0: none).
        identifiers_csv: a vertical party's medmnist archive: its test split's identifiers.
    """

    __test__ = False  # not a test class, whatever pytest makes of its name

    enabled: bool = True
    path: str | None = None
    split: str | None = None
    labels_csv: str | None = None
    masks_csv: str | None = None
    samples: int = 0
    identifiers_csv: str | None = None


def local_test_source(pool: DataSource, settings: TestSettings) -> DataSource | None:
    """Where the test set comes from, as a source of its own; ``None``: no test set.

    Raises:
        ConfigError: the settings contradict the pool (its own split as the test set, a
            setting the pool's kind does not take).
    """
    if not settings.enabled or pool.kind == "table" or pool.identifiers_csv:
        return None
    if pool.kind == "medmnist":
        archive = settings.path or pool.path
        split = settings.split or DEFAULT_TEST_SPLIT
        if archive == pool.path and split == pool.split:
            raise ConfigError(
                f"data.test_split {split!r} is the training pool's own split (data.split): "
                "a test set must be held apart from what the hospital trains on"
            )
        if settings.split is None and not _archive_holds(archive, split):
            return None  # the default, and the archive has no test split
        return dataclasses.replace(pool, path=archive, split=split)
    if pool.kind == "synthetic":
        if settings.samples <= 0:
            return None
        return dataclasses.replace(pool, samples=settings.samples, seed=pool.seed + 1)
    own_csv = settings.masks_csv if pool.segmentation else settings.labels_csv
    if settings.path is None and own_csv is None:
        return None
    folder = settings.path or pool.path
    if settings.path is None and own_csv == (
        pool.masks_csv if pool.segmentation else pool.labels_csv
    ):
        raise ConfigError(
            "the test set's CSV is the training pool's own: a test set must be held apart "
            "from what the hospital trains on"
        )
    if pool.segmentation:
        return dataclasses.replace(pool, path=folder, masks_csv=own_csv)
    return dataclasses.replace(pool, path=folder, labels_csv=own_csv)


def vertical_test_source(pool: DataSource, settings: TestSettings) -> DataSource | None:
    """A vertical party's test records, identifiers with each, as a source of its own
    (``hospital_agent.data.load_vertical`` reads it); ``None``: no test set. A ``table``'s
    is the CSV ``data.test_path`` (its columns the pool's); a ``folder``'s is
    ``data.test_path`` (or the pool's folder) with ``data.test_labels_csv``; a
    ``medmnist`` archive's is its test split (``data.test_split``, default ``test``; of
    ``data.test_path`` when set) with ``data.test_identifiers_csv``.

    Raises:
        ConfigError: the test set would be the training pool itself.
    """
    if not settings.enabled:
        return None
    if pool.kind == "table":
        if settings.path is None:
            return None
        if settings.path == os.fspath(pool.path or ""):
            raise ConfigError("data.test_path is the training table itself (data.path)")
        return dataclasses.replace(pool, path=settings.path)
    if pool.kind == "medmnist":
        if settings.identifiers_csv is None:
            return None
        archive = settings.path or pool.path
        split = settings.split or DEFAULT_TEST_SPLIT
        if archive == pool.path and split == pool.split:
            raise ConfigError(f"data.test_split {split!r} is the training pool's own split")
        return dataclasses.replace(
            pool, path=archive, split=split, identifiers_csv=settings.identifiers_csv
        )
    if pool.kind == "folder" and settings.path is not None:
        return dataclasses.replace(
            pool, path=settings.path, labels_csv=settings.labels_csv or pool.labels_csv
        )
    return None


def _archive_holds(path: str | os.PathLike[str] | None, split: str) -> bool:
    """Whether the archive at ``path`` holds ``split`` (its images); a file that cannot
    be read holds none (the pool's own check reports it)."""
    try:
        with np.load(os.fspath(path or ""), allow_pickle=False) as archive:
            return f"{split}_images" in archive.files
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError):
        return False


def check_test(source: DataSource) -> DataSummary:
    """Read the test set once and summarise it (its size as ``split_sizes["train"]``).

    Raises:
        DataProblem: as :func:`hospital_agent.data.check_data`, naming the files.
    """
    return load_local(source, val_fraction=0.0)[1]


def with_test(summary: DataSummary, test: DataSummary | None) -> DataSummary:
    """The pool's summary with the test set's size and counts (``None``: no test set)."""
    if test is None:
        return summary
    size = test.split_sizes["train"]
    return dataclasses.replace(
        summary,
        split_sizes={**summary.split_sizes, "test": size},
        test_label_counts=None if test.task == "segmentation" else dict(test.label_counts),
        test_mask_classes=dict(test.mask_classes) if test.task == "segmentation" else None,
    )


def load_test_for_job(
    source: DataSource, *, input_shape: tuple[int, ...], num_classes: int, task: str
) -> DataSplit:
    """The test set as an evaluation of a job reads it: checked against the job's task,
    classes and shape, and fitted to it as the training data is.

    Raises:
        DataProblem: it does not fit the job (see :func:`load_for_job`).
    """
    data, _ = load_for_job(
        source,
        input_shape=input_shape,
        num_classes=num_classes,
        task=task,
        val_fraction=0.0,
    )
    if len(data.train) == 0:
        raise DataProblem.one(os.fspath(source.path or ""), "the test set holds no image")
    return data.train


__all__ = [
    "NO_TEST_SET",
    "TestSettings",
    "check_test",
    "load_test_for_job",
    "local_test_source",
    "vertical_test_source",
    "with_test",
]
