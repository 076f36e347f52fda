"""Load one split of a MedMNIST ``.npz`` archive (Yang et al., MedMNIST v2, 2023).

The archive holds ``{train,val,test}_images`` (uint8, ``(N, H, W)`` grey or
``(N, H, W, C)`` colour) and ``{train,val,test}_labels`` (integers, ``(N,)`` or
``(N, 1)``). It is read with ``allow_pickle=False`` always: a hospital's files are data,
and a pickled object array inside one must be refused, never executed.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from medsplit.data.shards import DataSplit
from medsplit.errors import DataError

SPLITS = ("train", "val", "test")
_ZIP_MAGIC = b"PK\x03\x04"  # an .npz is a zip archive
_NPY_MAGIC = b"\x93NUMPY"  # np.load also reads a single .npy array


def load_medmnist(path: str | os.PathLike[str], split: str = "train") -> DataSplit:
    """Read ``split`` of the MedMNIST archive at ``path``.

    Args:
        path: a MedMNIST-format ``.npz`` file.
        split: ``"train"``, ``"val"`` or ``"test"``.

    Returns:
        A :class:`DataSplit`: images float32 ``(N, C, H, W)`` scaled from 0..255 to [0, 1]
        (a channel axis is added to grey images, colour images are moved to channels
        first), labels int64 ``(N,)``.

    Raises:
        DataError: naming the file and what is wrong with it: missing, not an ``.npz``
            archive, a missing key (the message lists those present), an unknown split,
            pickled content, a wrong dtype or shape, mismatched lengths, negative labels.
    """
    name = os.fspath(path)
    if split not in SPLITS:
        raise DataError(f"{name}: unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if not Path(name).exists():
        raise DataError(f"{name}: no such file")
    if not Path(name).is_file():
        raise DataError(f"{name}: not a file")
    with open(name, "rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if not magic.startswith(_ZIP_MAGIC) and not magic.startswith(_NPY_MAGIC):
        # np.load would try to unpickle it and, with allow_pickle=False, say that the file
        # "contains pickled data": misleading for a damaged download or another format.
        raise DataError(
            f"{name}: not a MedMNIST .npz archive (it is not a zip archive: damaged, or "
            "another format)"
        )
    try:
        archive = np.load(name, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{name}: not a MedMNIST .npz archive ({e})") from e
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{name}: not an .npz archive (it holds a single .npy array)")
    with archive:
        images = _read(archive, name, f"{split}_images")
        labels = _read(archive, name, f"{split}_labels")
    return DataSplit(
        images=_images_to_tensor(images, name, split),
        labels=_labels_to_tensor(labels, name, split, expected=len(images)),
    )


def _read(archive: np.lib.npyio.NpzFile, name: str, key: str) -> np.ndarray:
    if key not in archive.files:
        present = ", ".join(archive.files) or "none"
        raise DataError(f"{name}: no array {key!r}; the archive holds: {present}")
    try:
        return archive[key]
    except ValueError as e:  # object arrays need pickle, which stays off
        raise DataError(f"{name}: cannot read {key!r} without unpickling ({e})") from e
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{name}: {key!r} is damaged ({e})") from e


def _images_to_tensor(images: np.ndarray, name: str, split: str) -> torch.Tensor:
    key = f"{split}_images"
    if images.dtype != np.uint8:
        raise DataError(f"{name}: {key} must be uint8 (0..255), got {images.dtype}")
    if images.ndim == 3:
        tensor = torch.from_numpy(images).unsqueeze(1)
    elif images.ndim == 4 and images.shape[-1] in (1, 3):
        # MedMNIST stores colour as (N, H, W, C); torch wants channels first.
        tensor = torch.from_numpy(images).permute(0, 3, 1, 2)
    else:
        # A 4-D array with a last axis other than 1 or 3 is most likely a MedMNIST 3D
        # volume (N, D, H, W); guessing would silently train on the wrong axes.
        raise DataError(
            f"{name}: {key} has shape {images.shape}; expected (N, H, W) or (N, H, W, C) "
            "with C = 1 or 3"
        )
    if len(tensor) == 0:
        raise DataError(f"{name}: {key} holds no images")
    return tensor.to(torch.float32).div_(255.0).contiguous()


def _labels_to_tensor(labels: np.ndarray, name: str, split: str, *, expected: int) -> torch.Tensor:
    key = f"{split}_labels"
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{name}: {key} must hold integers, got {labels.dtype}")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise DataError(
            f"{name}: {key} has shape {labels.shape}; expected (N,) or (N, 1) "
            "(multi-label archives are not supported)"
        )
    if len(labels) != expected:
        raise DataError(
            f"{name}: {split} has {expected} images but {len(labels)} labels; they must match"
        )
    if labels.min() < 0:
        raise DataError(f"{name}: {key} holds negative labels (smallest {labels.min()})")
    return torch.from_numpy(labels.astype(np.int64))
