"""A hospital's segmentation set: real PNG and NIfTI images with their masks, read by
MONAI's readers, checked against the job (each problem naming its file), split,
summarised for the heartbeat and fitted to the job's shape."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from hospital_agent.data import DataProblem, DataSource, check_data, load_local, prepare
from hospital_agent.data.masks import IMAGES_DIR, MASKS_DIR

H, W = 12, 10


def grey(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(H, W), dtype=np.uint8)


def mask_of(seed: int, classes: int = 2) -> np.ndarray:
    """Class indices, every class present (so that the counts are known)."""
    mask = np.zeros((H, W), dtype=np.uint8)
    mask[2:6, 2 + seed % 3 : 6 + seed % 3] = 1
    if classes > 2:
        mask[8:10, 1:4] = 2
    return mask


def png_pairs(root: Path, n: int = 5, classes: int = 2) -> Path:
    (root / IMAGES_DIR).mkdir(parents=True)
    (root / MASKS_DIR).mkdir()
    for i in range(n):
        Image.fromarray(grey(i)).save(root / IMAGES_DIR / f"case{i}.png")
        Image.fromarray(mask_of(i, classes)).save(root / MASKS_DIR / f"case{i}.png")
    return root


def segmentation(root: Path, **kw: object) -> DataSource:
    return DataSource(kind="folder", path=str(root), task="segmentation", **kw)  # type: ignore[arg-type]


def test_png_images_and_masks_of_one_name_load_as_class_index_masks(tmp_path: Path) -> None:
    root = png_pairs(tmp_path / "set", n=5, classes=3)
    data, summary = load_local(segmentation(root), input_shape=(1, H, W), num_classes=3)
    pool = torch.cat([data.train.labels, data.val.labels])
    assert data.train.images.shape[1:] == (1, H, W) and pool.shape[1:] == (1, H, W)
    assert pool.dtype == torch.int64
    # The masks are the files' class indices, rows first like their images.
    expected = [torch.from_numpy(mask_of(i, 3).astype(np.int64))[None] for i in range(5)]
    assert all(any(torch.equal(m, e) for e in expected) for m in pool)
    assert summary.to_json() == {
        "image_shape": [1, H, W],
        "split_sizes": {"train": 4, "val": 1},
        "task": "segmentation",
        "masks": 5,
        "mask_classes": {"0": 5, "1": 5, "2": 5},
    }


def test_nifti_pairs_from_a_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(3):
        nib.save(
            nib.Nifti1Image(rng.random((H, W)).astype(np.float32), np.eye(4)),
            tmp_path / f"im{i}.nii.gz",
        )
        nib.save(
            nib.Nifti1Image(mask_of(i).astype(np.int16), np.eye(4)), tmp_path / f"seg{i}.nii.gz"
        )
    (tmp_path / "pairs.csv").write_text(
        "image,mask\n" + "".join(f"im{i}.nii.gz,seg{i}.nii.gz\n" for i in range(3))
    )
    data, summary = load_local(
        segmentation(tmp_path, masks_csv="pairs.csv"), input_shape=(1, H, W), num_classes=2
    )
    assert summary.masks == 3 and summary.mask_classes == {"0": 3, "1": 3}
    assert set(torch.cat([data.train.labels, data.val.labels]).unique().tolist()) == {0, 1}


def test_a_mask_of_the_wrong_classes_or_shape_is_named_before_the_turn(tmp_path: Path) -> None:
    root = png_pairs(tmp_path / "set", n=4)
    Image.fromarray(mask_of(1) * 255).save(root / MASKS_DIR / "case1.png")  # 0/255
    Image.fromarray(np.zeros((H + 2, W), dtype=np.uint8)).save(root / MASKS_DIR / "case2.png")
    Image.fromarray(np.stack([mask_of(3)] * 3, axis=-1)).save(root / MASKS_DIR / "case3.png")
    Image.fromarray(grey(9)).save(root / IMAGES_DIR / "lonely.png")
    with pytest.raises(DataProblem) as excinfo:
        check_data(segmentation(root), input_shape=(1, H, W), num_classes=2)
    found = {(Path(p.file).name if p.file else None, p.reason) for p in excinfo.value.problems}
    reasons = {name: reason for name, reason in found}
    assert "class 255, outside the job's classes 0..1" in reasons["case1.png"]
    assert f"mask is [{H + 2}, {W}] but its image case2.png is [{H}, {W}]" in reasons["case2.png"]
    assert "has 3" in reasons["case3.png"]
    assert "has no mask of that name" in reasons["lonely.png"]
    assert excinfo.value.total == 4


def test_masks_are_resized_with_their_images_keeping_their_classes(tmp_path: Path) -> None:
    root = png_pairs(tmp_path / "set", n=3)
    data, _ = load_local(segmentation(root), input_shape=(1, H, W), num_classes=2)
    fitted = prepare(data, input_shape=(1, 2 * H, 2 * W), num_classes=2)
    assert fitted.train.images.shape[1:] == (1, 2 * H, 2 * W)
    assert fitted.train.labels.shape[1:] == (1, 2 * H, 2 * W)
    assert fitted.train.labels.dtype == torch.int64
    # Nearest-neighbour: each pixel of the original mask is a 2x2 block of the new one.
    assert torch.equal(fitted.train.labels[:, :, ::2, ::2], data.train.labels)


def test_synthetic_segmentation_set() -> None:
    source = DataSource(
        kind="synthetic", task="segmentation", samples=6, num_classes=2, shape=(1, 32, 32), seed=3
    )
    data, summary = load_local(source, input_shape=(1, 32, 32), num_classes=2)
    assert summary.task == "segmentation" and summary.masks == 6
    assert data.train.labels.shape[1:] == (1, 32, 32)
    assert set(summary.mask_classes) == {"0", "1"}
    three = DataSource(
        kind="synthetic", task="segmentation", samples=6, num_classes=3, shape=(1, 32, 32), seed=3
    )
    with pytest.raises(DataProblem, match=r"mask holds class 2, outside the job's classes 0\.\.1"):
        check_data(three, num_classes=2)
