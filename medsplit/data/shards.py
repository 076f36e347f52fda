"""A labelled split of images, and dealing one out to several hospitals."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medsplit.errors import ConfigError, DataError


@dataclass(frozen=True)
class DataSplit:
    """Images and their labels, ready for training: a data split (train, validation, a
    hospital's shard), not to be confused with a cut model (`SplitModel`).

    Attributes:
        images: float32, ``(N, C, H, W)`` (or ``(N, C, D, H, W)`` for volumes), values
            in [0, 1] as produced by the loaders in this package.
        labels: int64 class indices: ``(N,)``, one per image (classification), or masks
            ``(N, 1, H, W)`` (``(N, 1, D, H, W)``), one per pixel, of the images' spatial
            shape (segmentation). Masks given as ``(N, H, W)`` are stored with the
            channel added: ``(N, 1, *spatial)`` is the one form, MONAI's.
            Whether the values are the job's classes is checked against the job
            (:func:`medsplit.training.tasks.check_targets`).

    Raises:
        DataError: the dtypes or shapes above do not hold, or the lengths differ.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.images, torch.Tensor) or self.images.dtype != torch.float32:
            raise DataError(f"images must be a float32 tensor, got {_describe(self.images)}")
        if self.images.dim() < 3:
            raise DataError(
                f"images must have shape (N, C, *spatial), got {tuple(self.images.shape)}"
            )
        if not isinstance(self.labels, torch.Tensor) or self.labels.dtype != torch.int64:
            raise DataError(f"labels must be an int64 tensor, got {_describe(self.labels)}")
        spatial = tuple(self.images.shape[2:])
        if self.labels.dim() == 1 + len(spatial) and tuple(self.labels.shape[1:]) == spatial:
            object.__setattr__(self, "labels", self.labels.unsqueeze(1))  # the channel
        if self.labels.dim() != 1 and tuple(self.labels.shape[1:]) != (1, *spatial):
            side = ", ".join(map(str, spatial))
            raise DataError(
                f"labels must have shape (N,) (a class per image) or (N, 1, {side}) (a mask "
                f"per image, of its spatial shape), got {tuple(self.labels.shape)}"
            )
        if len(self.images) != len(self.labels):
            raise DataError(
                f"{len(self.images)} images but {len(self.labels)} labels; they must match"
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def has_masks(self) -> bool:
        """Whether the labels are masks (segmentation) rather than one class per image."""
        return self.labels.dim() > 1


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return type(value).__name__


def shard(split: DataSplit, parts: int, *, seed: int = 0) -> list[DataSplit]:
    """Shuffle ``split`` deterministically and deal it into ``parts`` contiguous shares.

    Share sizes differ by at most one (the first ``len(split) % parts`` shares get the
    extra item); every item lands in exactly one share.

    Args:
        split: what to deal out.
        parts: number of shares, e.g. the number of hospitals.
        seed: seeds the shuffle; the same seed gives the same shares.

    Returns:
        ``parts`` new splits (copies; ``split`` is not changed).

    Raises:
        ConfigError: ``parts`` is not in ``1..len(split)`` or ``seed`` is negative.
    """
    if not _is_int(parts) or not 1 <= parts <= len(split):
        raise ConfigError(
            f"parts must be an integer from 1 to len(split) = {len(split)}, got {parts!r}"
        )
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(split), generator=generator)
    base, extra = divmod(len(split), parts)
    sizes = [base + 1 if i < extra else base for i in range(parts)]
    return [DataSplit(split.images[idx], split.labels[idx]) for idx in order.split(sizes)]


def label_counts(split: DataSplit) -> dict[int, int]:
    """How many items carry each label, for the labels present, in ascending order."""
    values, counts = torch.unique(split.labels, sorted=True, return_counts=True)
    return {int(v): int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
