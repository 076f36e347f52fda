"""hospital_agent.data: real files read by MONAI's readers, checks, split, transforms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

from hospital_agent.data import (
    DataProblem,
    DataSource,
    LocalData,
    check_data,
    load_local,
    load_source,
    prepare,
    read_image,
    split_local,
    summary,
)
from medsplit.data import synthetic_split
from medsplit.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
BREAST = SHARED / "breastmnist_28.npz"
needs_breast = pytest.mark.skipif(not BREAST.is_file(), reason=f"{BREAST} is absent")

# The heartbeat's DatasetSummarySerializer (platform/hospitals/api/serializers.py).
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# -- writing tiny real files --------------------------------------------------------


def grey(seed: int, h: int = 10, w: int = 12) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w), dtype=np.uint8)


def write_png(path: Path, array: np.ndarray) -> None:
    Image.fromarray(array).save(path)


def write_dicom(path: Path, array: np.ndarray) -> None:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "OT"
    ds.Rows, ds.Columns = array.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.PixelData = array.astype(np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)


def write_nifti(path: Path, array: np.ndarray) -> None:
    nib.save(nib.Nifti1Image(array.astype(np.float32), np.eye(4)), path)


def write_csv(folder: Path, rows: list[tuple[str, object]], name: str = "labels.csv") -> None:
    lines = ["file,label", *(f"{f},{label}" for f, label in rows)]
    (folder / name).write_text("\n".join(lines) + "\n")


def png_folder(tmp_path: Path, n: int = 10, h: int = 10, w: int = 12) -> Path:
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i in range(n):
        write_png(folder / f"img{i}.png", grey(i, h, w))
    write_csv(folder, [(f"img{i}.png", i % 2) for i in range(n)])
    return folder


def folder_source(folder: Path, **kw: object) -> DataSource:
    return DataSource(kind="folder", path=str(folder), **kw)  # type: ignore[arg-type]


def problems_of(excinfo: pytest.ExceptionInfo[DataProblem]) -> list[tuple[str | None, str]]:
    return [(p.file, p.reason) for p in excinfo.value.problems]


# -- each source kind ---------------------------------------------------------------


def test_png_folder_loads_grey_as_one_channel_rows_first(tmp_path: Path) -> None:
    folder = png_folder(tmp_path, n=4, h=10, w=12)
    split = load_source(folder_source(folder))
    assert split.images.shape == (4, 1, 10, 12)  # (C, H, W): not MONAI's swapped (W, H)
    assert split.images.dtype == torch.float32 and split.labels.tolist() == [0, 1, 0, 1]
    assert split.images.min() >= 0 and split.images.max() <= 1
    # Pixel layout survives: the scaled image is the PNG's array min-max scaled.
    expected = grey(0, 10, 12).astype(np.float32)
    expected = (expected - expected.min()) / (expected.max() - expected.min())
    assert np.allclose(split.images[0, 0].numpy(), expected, atol=1e-6)


def test_colour_jpeg_is_three_channels(tmp_path: Path) -> None:
    rgb = np.stack([grey(1), grey(2), grey(3)], axis=-1)
    Image.fromarray(rgb).save(tmp_path / "a.jpg")
    Image.fromarray(rgb).save(tmp_path / "b.jpeg")
    write_csv(tmp_path, [("a.jpg", 0), ("b.jpeg", 1)])
    split = load_source(folder_source(tmp_path))
    assert split.images.shape == (2, 3, 10, 12)


def test_dicom_folder(tmp_path: Path) -> None:
    for i in range(3):
        write_dicom(tmp_path / f"s{i}.dcm", grey(i).astype(np.uint16) * 200)
    write_csv(tmp_path, [(f"s{i}.dcm", i % 2) for i in range(3)])
    split = load_source(folder_source(tmp_path))
    assert split.images.shape == (3, 1, 10, 12)
    assert split.images.max() == 1.0  # 16-bit values scaled per image


def test_nifti_volumes_and_custom_csv_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    write_nifti(tmp_path / "v0.nii.gz", rng.random((6, 7, 8)))
    write_nifti(tmp_path / "v1.nii", rng.random((6, 7, 8)))
    write_csv(tmp_path, [("v0.nii.gz", 0), ("v1.nii", 1)], name="meta.csv")
    split = load_source(folder_source(tmp_path, labels_csv="meta.csv"))
    assert split.images.shape == (2, 1, 6, 7, 8)  # (N, C, H, W, D)


def test_unsupported_suffix_is_named() -> None:
    with pytest.raises(DataProblem, match="unsupported file type"):
        read_image("x.bmp")


def test_synthetic_source() -> None:
    split = load_source(DataSource(kind="synthetic", samples=12, num_classes=3, seed=4))
    assert torch.equal(split.images, synthetic_split(12, num_classes=3, seed=4).images)


@needs_breast
def test_breastmnist_from_shared_data() -> None:
    source = DataSource(kind="medmnist", path=str(BREAST))
    data, found = load_local(source, input_shape=(1, 28, 28), num_classes=2, seed=0)
    assert found.to_json() == {
        "image_shape": [1, 28, 28],
        "label_counts": {"0": 147, "1": 399},
        "split_sizes": {"train": 437, "val": 109},
    }
    # Stratified: both parts keep roughly the pool's 27% malignant.
    assert 0.2 < (data.val.labels == 0).float().mean() < 0.34
    val_split = load_source(DataSource(kind="medmnist", path=str(BREAST), split="val"))
    assert len(val_split) == 78
    prepared = prepare(data, input_shape=(1, 64, 64), num_classes=2)
    assert prepared.train.images.shape == (437, 1, 64, 64)


def test_medmnist_source_on_a_generated_archive(tmp_path: Path) -> None:
    path = tmp_path / "tiny.npz"
    labels = np.array([0, 1, 2, 1, 0, 1], dtype=np.uint8)
    images = np.stack([grey(i, 28, 28) for i in range(6)])
    np.savez(
        path,
        train_images=images,
        train_labels=labels,
        val_images=images[:2],
        val_labels=labels[:2],
        test_images=images[:2],
        test_labels=labels[:2],
    )
    assert len(load_source(DataSource(kind="medmnist", path=str(path)))) == 6
    with pytest.raises(DataProblem) as excinfo:
        check_data(DataSource(kind="medmnist", path=str(path)), num_classes=2)
    assert excinfo.value.file == str(path)
    assert "label 2 of item 2 is outside the job's classes 0..1" in str(excinfo.value)


# -- every problem, named ---------------------------------------------------------------


def test_missing_archive_folder_and_csv(tmp_path: Path) -> None:
    with pytest.raises(DataProblem, match="no such file") as excinfo:
        check_data(DataSource(kind="medmnist", path=str(tmp_path / "none.npz")))
    assert excinfo.value.file == str(tmp_path / "none.npz")
    with pytest.raises(DataProblem, match="no such folder"):
        check_data(folder_source(tmp_path / "nope"))
    with pytest.raises(DataProblem, match="no such labels file") as excinfo:
        check_data(folder_source(tmp_path))
    assert excinfo.value.file == str(tmp_path / "labels.csv")
    assert isinstance(excinfo.value, DataError)


def test_all_problems_are_reported_together_and_named(tmp_path: Path) -> None:
    folder = png_folder(tmp_path, n=4)
    (folder / "img1.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")  # corrupt
    rows = [(f"img{i}.png", i % 2) for i in range(4)]
    rows += [("gone.png", 0), ("img0.png", 1), ("img3.png", 1), ("../up.png", 0)]
    write_csv(folder, [*rows[:3], ("img3.png", 5), rows[4], rows[5], ("x.png", "one")])
    with pytest.raises(DataProblem) as excinfo:
        check_data(folder_source(folder), num_classes=2)
    found = problems_of(excinfo)
    csv_path = str(folder / "labels.csv")
    assert (str(folder / "img1.png"), "cannot be read as a PNG/JPEG image (RuntimeError)") in [
        (f, re.sub(r"\(\w+\)", "(RuntimeError)", r)) for f, r in found
    ]
    assert (
        str(folder / "img3.png"),
        "labels.csv row 5: label 5 is outside the job's classes 0..1",
    ) in found
    assert (str(folder / "gone.png"), "listed in labels.csv row 6 but no such file") in found
    assert (csv_path, "labels.csv row 7: 'img0.png' is listed again (row 2)") in found
    assert (csv_path, "labels.csv row 8: the label is not an integer") in found
    message = str(excinfo.value)
    assert message.startswith("5 problems with the local data:")
    assert excinfo.value.file == csv_path  # CSV problems come first, then images


def test_bad_csv_rows(tmp_path: Path) -> None:
    folder = png_folder(tmp_path, n=2)
    (folder / "labels.csv").write_text("file,label\n../img0.png,0\nimg1.png,1,extra\n/etc/x,1\n")
    with pytest.raises(DataProblem) as excinfo:
        check_data(folder_source(folder))
    reasons = [r for _, r in problems_of(excinfo)]
    assert reasons == [
        "labels.csv row 2: '../img0.png' must be a name inside the folder",
        "labels.csv row 3: expected 2 columns, got 3",
        "labels.csv row 4: '/etc/x' must be a name inside the folder",
    ]
    (folder / "labels.csv").write_text("name,class\nimg0.png,0\n")
    with pytest.raises(DataProblem, match="header file,label"):
        check_data(folder_source(folder))


def test_empty_dataset(tmp_path: Path) -> None:
    write_csv(tmp_path, [])
    with pytest.raises(DataProblem, match="lists no images: the dataset is empty"):
        check_data(folder_source(tmp_path))


def test_inconsistent_shapes_need_the_job_shape(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", grey(0, 10, 12))
    write_png(tmp_path / "b.png", grey(1, 10, 12))
    write_png(tmp_path / "c.png", grey(2, 20, 20))
    write_csv(tmp_path, [("a.png", 0), ("b.png", 1), ("c.png", 0)])
    with pytest.raises(DataProblem, match="give the job's input shape") as excinfo:
        check_data(folder_source(tmp_path))
    assert excinfo.value.file == str(tmp_path / "c.png")
    # With the job's shape they are resized as read; the summary gives the shape as loaded.
    found = check_data(folder_source(tmp_path), input_shape=(1, 16, 16), num_classes=2)
    assert found.image_shape == [1, 10, 12]
    assert load_source(folder_source(tmp_path), input_shape=(1, 16, 16)).images.shape == (
        3,
        1,
        16,
        16,
    )


def test_channels_that_cannot_be_resized(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", grey(0))
    write_png(tmp_path / "b.png", grey(1))
    Image.fromarray(np.stack([grey(2)] * 3, axis=-1)).save(tmp_path / "c.png")
    write_nifti(tmp_path / "d.nii.gz", np.ones((4, 4, 4)))
    write_csv(tmp_path, [("a.png", 0), ("b.png", 1), ("c.png", 0), ("d.nii.gz", 1)])
    with pytest.raises(DataProblem) as excinfo:
        check_data(folder_source(tmp_path), input_shape=(1, 28, 28))
    files = [f for f, _ in problems_of(excinfo)]
    assert files == [str(tmp_path / "c.png"), str(tmp_path / "d.nii.gz")]
    assert "cannot be resized to match" in str(excinfo.value)
    # Consistent grey images against an RGB job: one clear problem for the folder.
    write_csv(tmp_path, [("a.png", 0), ("b.png", 1)])
    with pytest.raises(DataProblem, match=r"1 channel\(s\) \[1, 10, 12\] but the job expects 3"):
        check_data(folder_source(tmp_path), input_shape=(3, 28, 28))
    with pytest.raises(DataProblem, match="images are 2-D"):
        check_data(folder_source(tmp_path), input_shape=(1, 8, 8, 8))


def test_messages_never_hold_pixel_values(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    marker = 123  # a pixel value that appears nowhere else
    write_png(folder / "a.png", np.full((10, 12), marker, dtype=np.uint8))
    write_png(folder / "b.png", np.full((9, 9), marker, dtype=np.uint8))
    write_nifti(folder / "c.nii", np.full((5, 5), np.nan))
    write_csv(folder, [("a.png", 0), ("b.png", 1), ("c.nii", 7)])
    with pytest.raises(DataProblem) as excinfo:
        check_data(folder_source(folder), num_classes=2)
    message = str(excinfo.value).replace(str(folder), "<folder>")
    assert "holds NaN or infinite values" in message and str(marker) not in message
    assert excinfo.value.total == 3


def test_synthetic_config_problems() -> None:
    with pytest.raises(ConfigError, match="samples >= 1"):
        DataSource(kind="synthetic")
    with pytest.raises(ConfigError, match="kind must be one of"):
        DataSource(kind="zip")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a path"):
        DataSource(kind="folder")
    with pytest.raises(DataProblem, match="synthetic source: num_classes"):
        check_data(DataSource(kind="synthetic", samples=4, num_classes=1))
    with pytest.raises(DataProblem, match=r"outside the job's classes 0\.\.1"):
        check_data(DataSource(kind="synthetic", samples=9, num_classes=3), num_classes=2)


# -- summary, split, prepare ---------------------------------------------------


def test_summary_matches_the_heartbeat_format(tmp_path: Path) -> None:
    found = check_data(folder_source(png_folder(tmp_path, n=10)), num_classes=2, seed=1)
    as_json = json.loads(json.dumps(found.to_json()))
    assert as_json == {
        "image_shape": [1, 10, 12],
        "label_counts": {"0": 5, "1": 5},
        "split_sizes": {"train": 8, "val": 2},
    }
    assert all(isinstance(s, int) and 1 <= s <= 16384 for s in as_json["image_shape"])
    assert 1 <= len(as_json["image_shape"]) <= 4
    assert all(LABEL_PATTERN.fullmatch(k) for k in as_json["label_counts"])


def test_split_is_deterministic_stratified_and_disjoint() -> None:
    pool = synthetic_split(50, num_classes=2, seed=3)
    a = split_local(pool, val_fraction=0.2, seed=7)
    b = split_local(pool, val_fraction=0.2, seed=7)
    c = split_local(pool, val_fraction=0.2, seed=8)
    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.train.labels, b.train.labels)
    assert not torch.equal(a.val.images, c.val.images)
    assert len(a.train) == 40 and len(a.val) == 10
    assert a.val.labels.bincount().tolist() == [5, 5]
    rows = {tuple(x.flatten()[:8].tolist()) for x in a.train.images}
    assert not rows & {tuple(x.flatten()[:8].tolist()) for x in a.val.images}
    assert len(split_local(pool, val_fraction=0.0).val) == 0
    with pytest.raises(ConfigError, match="val_fraction"):
        split_local(pool, val_fraction=1.0)


def test_prepare_resizes_28_to_64_and_scales() -> None:
    data = split_local(synthetic_split(10, shape=(1, 28, 28), seed=0), seed=0)
    out = prepare(data, input_shape=(1, 64, 64), num_classes=2)
    assert out.train.images.shape == (8, 1, 64, 64) and out.val.images.shape == (2, 1, 64, 64)
    assert torch.equal(out.train.labels, data.train.labels)
    flat = out.train.images.flatten(1)
    assert torch.allclose(flat.min(1).values, torch.zeros(8))
    assert torch.allclose(flat.max(1).values, torch.ones(8))
    assert summary(data).image_shape == [1, 28, 28]  # summarise before prepare
    # Volumes (C, H, W, D) too.
    vol = split_local(synthetic_split(4, shape=(1, 8, 8, 8), seed=0), val_fraction=0.0)
    assert prepare(vol, input_shape=(1, 12, 12, 12), num_classes=2).train.images.shape == (
        4,
        1,
        12,
        12,
        12,
    )


def test_prepare_refuses_what_it_cannot_fit() -> None:
    data = split_local(synthetic_split(10, num_classes=3, seed=0), seed=0)
    with pytest.raises(DataProblem, match="1 channel"):
        prepare(data, input_shape=(3, 28, 28), num_classes=3)
    with pytest.raises(DataProblem, match=r"outside the job's classes 0\.\.1"):
        prepare(data, input_shape=(1, 28, 28), num_classes=2)
    with pytest.raises(ConfigError, match="input_shape"):
        prepare(data, input_shape=(28, 28), num_classes=3)


def test_local_data_is_a_plain_pair() -> None:
    pool = synthetic_split(6, seed=0)
    data = LocalData(train=pool, val=pool)
    assert summary(data).split_sizes == {"train": 6, "val": 6}


def test_every_reader_hands_plain_tensors_to_training(tmp_path: Path) -> None:
    """MONAI's transforms return MetaTensors; one reaching training sends every op of the
    front through MetaTensor's ``__torch_function__`` (measured: about 1.5 ms of a 20 ms
    small_cnn step). ``torch.as_tensor`` keeps the subclass; every reader drops it."""
    from hospital_agent.data import load_vertical
    from hospital_agent.data.masks import IMAGES_DIR, MASKS_DIR
    from hospital_agent.data.transforms import load_for_job, load_for_prediction

    folder = png_folder(tmp_path, h=10, w=12)
    (tmp_path / "other.png").write_bytes((folder / "img0.png").read_bytes())
    write_png(folder / "img9.png", grey(9, 12, 12))  # another shape: the folder is resized
    pairs = tmp_path / "pairs"
    for sub in (IMAGES_DIR, MASKS_DIR):
        (pairs / sub).mkdir(parents=True)
    for i in range(4):
        write_png(pairs / IMAGES_DIR / f"case{i}.png", grey(i))
        write_png(pairs / MASKS_DIR / f"case{i}.png", (grey(i + 10) > 127).astype(np.uint8))
    synthetic = DataSource(kind="synthetic", samples=10, shape=(1, 28, 28), seed=0)
    fitted = [
        load_for_job(source, input_shape=shape, num_classes=2, task=task)[0]
        for source, shape, task in (
            (synthetic, (1, 28, 28), "classification"),  # the job's shape: nothing resized
            (synthetic, (1, 32, 32), "classification"),
            (folder_source(folder), (1, 10, 12), "classification"),
            (folder_source(folder), (1, 16, 16), "classification"),
            (
                DataSource(kind="folder", path=str(pairs), task="segmentation"),
                (1, 16, 16),
                "segmentation",
            ),
        )
    ]
    tensors = [t for data in fitted for s in (data.train, data.val) for t in (s.images, s.labels)]
    tensors.append(read_image(folder / "img0.png"))
    tensors.append(load_for_prediction([tmp_path / "other.png"], input_shape=(1, 16, 16)))
    tensors.append(load_vertical(folder_source(folder), input_shape=(1, 16, 16)).features)
    assert [type(t).__name__ for t in tensors] == ["Tensor"] * len(tensors)
