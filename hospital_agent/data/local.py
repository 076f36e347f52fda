"""The hospital's own train/validation split, its summary, and the check before a turn.

The validation part never leaves the hospital; only its size does, in the summary the
agent sends with each heartbeat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hospital_agent.data.masks import mask_classes, read_segmentation_source
from hospital_agent.data.sources import DataSource, read_source
from medsplit.data import DataSplit, label_counts
from medsplit.errors import ConfigError

DEFAULT_VAL_FRACTION = 0.2


@dataclass(frozen=True)
class LocalData:
    """The hospital's pool, split into what it trains on and what it validates on."""

    train: DataSplit
    val: DataSplit


@dataclass(frozen=True)
class DataSummary:
    """Sizes only, never data: what the coordinator's heartbeat accepts.

    Attributes:
        image_shape: one image's shape as loaded (before resizing), channels first.
        label_counts: items per label over train and val, e.g. ``{"0": 120, "1": 300}``
            (empty for a segmentation set: its masks are counted instead).
        split_sizes: ``{"train": n, "val": m}``.
        task: ``"classification"`` or ``"segmentation"`` (a mask per image).
        masks: segmentation: how many masks (one per image).
        mask_classes: segmentation: in how many masks each class appears, e.g.
            ``{"0": 40, "1": 37}`` (the classes present).
        test_label_counts, test_mask_classes: the local test set's (its size is
            ``split_sizes["test"]``), of the task's kind; ``None``: no test set
            (:mod:`hospital_agent.data.testset`).
    """

    image_shape: list[int]
    label_counts: dict[str, int]
    split_sizes: dict[str, int]
    task: str = "classification"
    masks: int = 0
    mask_classes: dict[str, int] = field(default_factory=dict)
    test_label_counts: dict[str, int] | None = None
    test_mask_classes: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The heartbeat's ``dataset_summary`` (plain lists, dicts and ints): a
        classification set's as before tasks existed; a segmentation set's names its
        task and counts its masks instead of labels."""
        body = asdict(self)
        for name in ("test_label_counts", "test_mask_classes"):
            if body[name] is None:
                del body[name]
        if self.task == "segmentation":
            del body["label_counts"]
        else:
            for name in ("task", "masks", "mask_classes"):
                del body[name]
        return body


def split_local(
    split: DataSplit, *, val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0
) -> LocalData:
    """Split the pool into train and validation, stratified by label, deterministically.

    Each label's items are shuffled with a generator seeded by ``seed`` (the global RNG
    is unused) and ``round(count * val_fraction)`` of them go to validation, but at least
    one item of each label stays in train. Both parts keep the pool's order. A
    segmentation set (masks, not labels) is split as one group: its items are the group.

    Raises:
        ConfigError: ``val_fraction`` is not in [0, 1) or ``seed`` is not an integer >= 0.
    """
    if (
        not isinstance(val_fraction, int | float)
        or isinstance(val_fraction, bool)
        or not 0 <= val_fraction < 1
    ):
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    generator = torch.Generator().manual_seed(seed)
    in_val = torch.zeros(len(split), dtype=torch.bool)
    if split.has_masks:  # masks: no label to stratify by
        groups = [torch.arange(len(split))]
    else:
        groups = [torch.nonzero(split.labels == label).flatten() for label in label_counts(split)]
    for members in groups:
        take = min(math.floor(len(members) * val_fraction + 0.5), len(members) - 1)
        if take > 0:
            chosen = members[torch.randperm(len(members), generator=generator)[:take]]
            in_val[chosen] = True
    train, val = (~in_val).nonzero().flatten(), in_val.nonzero().flatten()
    return LocalData(
        train=DataSplit(split.images[train], split.labels[train]),
        val=DataSplit(split.images[val], split.labels[val]),
    )


def summary(data: LocalData, *, image_shape: Sequence[int] | None = None) -> DataSummary:
    """Summarise ``data`` for the heartbeat.

    Args:
        data: the split as loaded; call this before :func:`prepare` resizes it, or give
            ``image_shape``.
        image_shape: one image's shape as loaded; defaults to the train images' shape.
    """
    shape = list(image_shape) if image_shape is not None else list(data.train.images.shape[1:])
    pool = DataSplit(
        torch.cat([data.train.images, data.val.images]),
        torch.cat([data.train.labels, data.val.labels]),
    )
    sizes = {"train": len(data.train), "val": len(data.val)}
    if pool.has_masks:
        return DataSummary(
            image_shape=[int(s) for s in shape],
            label_counts={},
            split_sizes=sizes,
            task="segmentation",
            masks=len(pool),
            mask_classes={str(k): v for k, v in mask_classes(pool.labels).items()},
        )
    return DataSummary(
        image_shape=[int(s) for s in shape],
        label_counts={str(k): v for k, v in label_counts(pool).items()},
        split_sizes=sizes,
    )


def load_local(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    seed: int = 0,
) -> tuple[LocalData, DataSummary]:
    """Read ``source``, check it against the job, split it, and summarise it.

    Raises:
        DataProblem: as :func:`check_data`.
        ConfigError: a malformed argument.
    """
    read = read_segmentation_source if source.segmentation else read_source
    loaded = read(source, input_shape=input_shape, num_classes=num_classes)
    data = split_local(loaded.split, val_fraction=val_fraction, seed=seed)
    return data, summary(data, image_shape=loaded.image_shape)


def check_data(
    source: DataSource,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    seed: int = 0,
) -> DataSummary:
    """Read everything once, before a turn, and report every problem together.

    Catches: a missing archive, folder, labels CSV or listed image; an unreadable or
    corrupt image or CSV; a malformed CSV (header, columns, non-integer label, names
    outside the folder, duplicates); a label outside ``0..num_classes-1``; images whose
    shapes differ (unless ``input_shape`` is given to resize them) or whose channels or
    dimensions differ from each other or from ``input_shape``; non-finite pixels; an
    empty dataset. Messages name the file (and CSV row) and never hold pixel values.

    Returns:
        The summary the agent reports in its heartbeat.

    Raises:
        DataProblem: up to :data:`~hospital_agent.data.problems.MAX_PROBLEMS` problems.
        ConfigError: a malformed argument.
    """
    return load_local(
        source,
        input_shape=input_shape,
        num_classes=num_classes,
        val_fraction=val_fraction,
        seed=seed,
    )[1]
