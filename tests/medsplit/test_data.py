"""Local data helpers: the MedMNIST loader, synthetic images, shards and batch orders."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from medsplit.data import (
    DataSplit,
    batch_order,
    iter_batches,
    label_counts,
    load_medmnist,
    shard,
    synthetic_split,
)
from medsplit.errors import ConfigError, DataError

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
BREAST = SHARED_DATA / "breastmnist_28.npz"
PNEUMONIA = SHARED_DATA / "pneumoniamnist_28_reconstructed.npz"

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real MedMNIST files not present at {SHARED_DATA}"
)


def _archive(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _grey(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


@pytest.fixture
def good_npz(tmp_path: Path) -> Path:
    return _archive(
        tmp_path / "good.npz",
        train_images=_grey(6),
        train_labels=np.array([0, 1, 1, 0, 2, 1], dtype=np.uint8),
        val_images=_grey(2, seed=1),
        val_labels=np.array([[1], [0]], dtype=np.uint8),
        test_images=_grey(3, seed=2),
        test_labels=np.array([0, 0, 1], dtype=np.int32),
    )


# --- real files (skipped without ../shared/data) ---


@needs_shared_data
@pytest.mark.parametrize(
    ("path", "split", "counts"),
    [
        (BREAST, "train", {0: 147, 1: 399}),
        (BREAST, "val", {0: 21, 1: 57}),
        (BREAST, "test", {0: 42, 1: 114}),
        (PNEUMONIA, "train", {0: 1214, 1: 3494}),
        (PNEUMONIA, "val", {0: 135, 1: 389}),
        (PNEUMONIA, "test", {0: 234, 1: 390}),
    ],
)
def test_real_files_load_with_the_readme_class_counts(
    path: Path, split: str, counts: dict[int, int]
) -> None:
    data = load_medmnist(path, split)
    assert label_counts(data) == counts
    assert data.images.shape == (sum(counts.values()), 1, 28, 28)
    assert data.images.dtype == torch.float32 and data.labels.dtype == torch.int64
    assert data.images.min() >= 0.0 and data.images.max() <= 1.0


@needs_shared_data
def test_real_files_label_shapes_differ_but_load_the_same() -> None:
    with np.load(BREAST) as breast, np.load(PNEUMONIA) as pneumonia:
        assert breast["train_labels"].ndim == 1
        assert pneumonia["train_labels"].shape[1:] == (1,)
        raw = pneumonia["train_images"][0]
    assert load_medmnist(BREAST).labels.shape == (546,)
    assert load_medmnist(PNEUMONIA).labels.shape == (4708,)
    assert torch.equal(load_medmnist(PNEUMONIA).images[0, 0], torch.from_numpy(raw) / 255.0)


# --- the loader on files written here ---


def test_grey_images_get_a_channel_and_are_scaled(good_npz: Path) -> None:
    raw = _grey(6)
    data = load_medmnist(good_npz)
    assert data.images.shape == (6, 1, 28, 28)
    assert data.images.dtype == torch.float32
    assert torch.equal(data.images[:, 0], torch.from_numpy(raw).float() / 255.0)
    assert data.labels.tolist() == [0, 1, 1, 0, 2, 1]
    assert data.labels.dtype == torch.int64
    assert len(data) == 6


def test_column_and_int32_labels_become_int64_vectors(good_npz: Path) -> None:
    val = load_medmnist(good_npz, "val")
    assert val.labels.shape == (2,) and val.labels.tolist() == [1, 0]
    test = load_medmnist(good_npz, split="test")
    assert test.labels.dtype == torch.int64 and test.labels.tolist() == [0, 0, 1]


def test_rgb_channels_last_moves_to_channels_first(tmp_path: Path) -> None:
    raw = np.random.default_rng(3).integers(0, 256, size=(4, 5, 7, 3), dtype=np.uint8)
    path = _archive(tmp_path / "rgb.npz", train_images=raw, train_labels=np.arange(4))
    data = load_medmnist(str(path))
    assert data.images.shape == (4, 3, 5, 7)
    assert data.images.is_contiguous()
    for c in range(3):
        assert torch.equal(data.images[:, c], torch.from_numpy(raw[..., c]).float() / 255.0)
    assert data.images.min() >= 0.0 and data.images.max() <= 1.0


def test_extremes_map_to_zero_and_one(tmp_path: Path) -> None:
    raw = np.array([[[0, 255]]], dtype=np.uint8)
    path = _archive(tmp_path / "x.npz", train_images=raw, train_labels=np.array([0]))
    assert load_medmnist(path).images.flatten().tolist() == [0.0, 1.0]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.npz"
    with pytest.raises(DataError, match=r"absent\.npz.*no such file"):
        load_medmnist(path)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a file"):
        load_medmnist(tmp_path)


@pytest.mark.parametrize("content", [b"hello, not an archive\n", b"PK\x03\x04 truncated zip", b""])
def test_not_an_npz(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.npz"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"junk\.npz.*not") as caught:
        load_medmnist(path)
    # Not numpy's "contains pickled data": nothing here is a pickle.
    assert "pickle" not in str(caught.value)


def test_a_single_npy_array_is_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "one.npy"
    np.save(path, _grey(2))
    with pytest.raises(DataError, match=r"one\.npy.*not an \.npz"):
        load_medmnist(path)


def test_missing_key_lists_the_keys_present(tmp_path: Path) -> None:
    path = _archive(tmp_path / "k.npz", train_images=_grey(2), extra=np.zeros(1))
    with pytest.raises(DataError, match=r"k\.npz.*'train_labels'.*train_images, extra"):
        load_medmnist(path)
    with pytest.raises(DataError, match="val_images"):
        load_medmnist(path, "val")


@pytest.mark.parametrize("split", ["validation", "Train", "", "all"])
def test_unknown_split(good_npz: Path, split: str) -> None:
    with pytest.raises(DataError, match=r"good\.npz.*unknown split.*train, val, test"):
        load_medmnist(good_npz, split)


def test_mismatched_lengths(tmp_path: Path) -> None:
    path = _archive(tmp_path / "m.npz", train_images=_grey(3), train_labels=np.array([0, 1]))
    with pytest.raises(DataError, match=r"m\.npz.*3 images but 2 labels"):
        load_medmnist(path)


@pytest.mark.parametrize(
    ("images", "labels", "message"),
    [
        (_grey(2).astype(np.float32), np.array([0, 1]), "uint8"),
        (_grey(2).astype(np.int16), np.array([0, 1]), "uint8"),
        (_grey(2), np.array([0.0, 1.0]), "integers"),
        (_grey(2), np.array([True, False]), "integers"),
        (_grey(2), np.array(["a", "b"]), "integers"),
        (_grey(2), np.array([[0, 1], [1, 0]]), r"\(N,\) or \(N, 1\)"),
        (_grey(2), np.array([[[0]], [[1]]]), r"\(N,\) or \(N, 1\)"),
        (_grey(2), np.array([0, -1]), "negative"),
        (_grey(2)[:, :, 0], np.array([0, 1]), r"\(N, H, W\)"),
        (np.zeros((2, 8, 8, 8), dtype=np.uint8), np.array([0, 1]), r"\(N, H, W\)"),
        (_grey(0), np.array([], dtype=np.uint8), "no images"),
    ],
)
def test_bad_dtypes_and_shapes(
    tmp_path: Path, images: np.ndarray, labels: np.ndarray, message: str
) -> None:
    path = _archive(tmp_path / "bad.npz", train_images=images, train_labels=labels)
    with pytest.raises(DataError, match=rf"bad\.npz.*{message}"):
        load_medmnist(path)


# A pickle whose loading calls _record: if the loader ever unpickled, _UNPICKLED would grow.
_UNPICKLED: list[str] = []


def _record(tag: str) -> str:
    _UNPICKLED.append(tag)
    return tag


class _Trap:
    def __reduce__(self) -> tuple:
        return (_record, ("unpickled",))


def test_pickled_object_array_is_refused_not_loaded(tmp_path: Path) -> None:
    traps = np.empty(2, dtype=object)
    traps[:] = [_Trap(), _Trap()]
    path = _archive(tmp_path / "evil.npz", train_images=traps, train_labels=np.array([0, 1]))
    _UNPICKLED.clear()
    with pytest.raises(DataError, match=r"evil\.npz.*train_images"):
        load_medmnist(path)
    assert _UNPICKLED == []
    # The trap is real: reading with pickle allowed does run it.
    with np.load(path, allow_pickle=True) as archive:
        archive["train_images"]
    assert _UNPICKLED == ["unpickled", "unpickled"]
    _UNPICKLED.clear()


def test_a_plain_pickle_file_is_refused_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    path.write_bytes(pickle.dumps(_Trap()))
    _UNPICKLED.clear()
    with pytest.raises(DataError, match=r"evil\.npz"):
        load_medmnist(path)
    assert _UNPICKLED == []


# --- Split ---


@pytest.mark.parametrize(
    ("images", "labels", "message"),
    [
        (
            torch.zeros(2, 1, 4, 4, dtype=torch.float64),
            torch.zeros(2, dtype=torch.int64),
            "float32",
        ),
        (np.zeros((2, 1, 4, 4), dtype=np.float32), torch.zeros(2, dtype=torch.int64), "float32"),
        (torch.zeros(4), torch.zeros(4, dtype=torch.int64), r"\(N, C"),
        (torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int32), "int64"),
        (torch.zeros(2, 1, 4, 4), torch.zeros(2, 1, dtype=torch.int64), r"\(N,\)"),
        (torch.zeros(2, 1, 4, 4), torch.zeros(3, dtype=torch.int64), "2 images but 3 labels"),
    ],
)
def test_split_checks_its_tensors(images: object, labels: object, message: str) -> None:
    with pytest.raises(DataError, match=message):
        DataSplit(images=images, labels=labels)  # type: ignore[arg-type]


def test_a_table_s_rows_are_a_split_with_a_class_each() -> None:
    """A vertical lab's records: (N, F) rows, their labels one class each (never taken
    for a mask of a shape with no sides)."""
    split = DataSplit(torch.zeros(3, 12), torch.tensor([0, 1, 0]))
    assert split.labels.shape == (3,) and not split.has_masks


def _indexed(n: int) -> DataSplit:
    """A split whose image i holds the value i, so pairing can be checked after shuffles."""
    ids = torch.arange(n)
    return DataSplit(images=ids.float().view(n, 1, 1, 1), labels=ids)


# --- synthetic images ---


def test_synthetic_shapes_dtypes_range_and_balance() -> None:
    data = synthetic_split(30, shape=(3, 20, 24), num_classes=4, seed=5)
    assert data.images.shape == (30, 3, 20, 24) and data.images.dtype == torch.float32
    assert data.labels.shape == (30,) and data.labels.dtype == torch.int64
    assert data.images.min() >= 0.0 and data.images.max() <= 1.0
    assert label_counts(data) == {0: 8, 1: 8, 2: 7, 3: 7}


def test_synthetic_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a, b = synthetic_split(20, seed=3), synthetic_split(20, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    c = synthetic_split(20, seed=4)
    assert not torch.equal(a.images, c.images)


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_synthetic_classes_are_learnable_by_a_class_mean_template(num_classes: int) -> None:
    train = synthetic_split(300, num_classes=num_classes, seed=0)
    test = synthetic_split(300, num_classes=num_classes, seed=1)
    means = torch.stack([train.images[train.labels == k].mean(0) for k in range(num_classes)])
    distances = torch.cdist(test.images.flatten(1), means.flatten(1))
    accuracy = (distances.argmin(1) == test.labels).float().mean().item()
    assert accuracy > 0.85  # chance is at most 0.5


def test_synthetic_volumes() -> None:
    data = synthetic_split(4, shape=(1, 6, 8, 8), seed=0)
    assert data.images.shape == (4, 1, 6, 8, 8)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"n": 0}, "n"),
        ({"n": 2.0}, "n"),
        ({"n": 4, "shape": (28, 28)}, "shape"),
        ({"n": 4, "shape": (1, 3, 28)}, "shape"),
        ({"n": 4, "shape": (0, 28, 28)}, "shape"),
        ({"n": 4, "shape": [1, 28, 28]}, "shape"),
        ({"n": 4, "num_classes": 1}, "num_classes"),
        ({"n": 4, "seed": -1}, "seed"),
    ],
)
def test_synthetic_rejects_bad_arguments(kwargs: dict, argument: str) -> None:
    with pytest.raises(ConfigError, match=argument):
        synthetic_split(**kwargs)


# --- shards ---


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 60), seed=st.integers(0, 2**31))
def test_shards_partition_near_equally_and_keep_pairs(
    data: st.DataObject, n: int, seed: int
) -> None:
    parts = data.draw(st.integers(1, n))
    shares = shard(_indexed(n), parts, seed=seed)
    sizes = [len(share) for share in shares]
    assert len(shares) == parts and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    ids = torch.cat([share.labels for share in shares])
    assert sorted(ids.tolist()) == list(range(n))
    for share in shares:
        assert torch.equal(share.images.view(-1), share.labels.float())


def test_shards_are_deterministic_and_shuffled() -> None:
    split = _indexed(100)
    first = [s.labels.tolist() for s in shard(split, 3, seed=1)]
    assert first == [s.labels.tolist() for s in shard(split, 3, seed=1)]
    assert first != [s.labels.tolist() for s in shard(split, 3, seed=2)]
    assert first[0] != list(range(34))  # not the original order
    assert torch.equal(split.labels, torch.arange(100))  # input untouched


@pytest.mark.parametrize("parts", [0, -1, 6, 2.0, True])
def test_shard_rejects_bad_part_counts(parts: object) -> None:
    with pytest.raises(ConfigError, match="parts"):
        shard(_indexed(5), parts)  # type: ignore[arg-type]


def test_shard_rejects_a_negative_seed() -> None:
    with pytest.raises(ConfigError, match="seed"):
        shard(_indexed(5), 2, seed=-1)


# --- batches ---


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 80),
    batch_size=st.integers(1, 30),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 1000),
    drop_last=st.booleans(),
)
def test_batch_order_covers_a_permutation(
    n: int, batch_size: int, seed: int, epoch: int, drop_last: bool
) -> None:
    batches = batch_order(n, batch_size=batch_size, seed=seed, epoch=epoch, drop_last=drop_last)
    assert all(b.dtype == torch.int64 for b in batches)
    if drop_last:
        assert len(batches) == n // batch_size
        assert all(len(b) == batch_size for b in batches)
    else:
        assert len(batches) == -(-n // batch_size)
        assert all(len(b) == batch_size for b in batches[:-1])
    seen = torch.cat(batches).tolist() if batches else []
    assert len(set(seen)) == len(seen)
    expected = n - n % batch_size if drop_last else n
    assert len(seen) == expected and set(seen) <= set(range(n))


def test_batch_order_depends_on_seed_and_epoch_only() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        return torch.cat(batch_order(50, batch_size=8, seed=seed, epoch=epoch)).tolist()

    torch.manual_seed(1)
    first = order(0, 0)
    torch.manual_seed(2)  # the global RNG plays no part
    assert order(0, 0) == first
    assert order(0, 1) != first
    assert order(1, 0) != first
    assert order(1, 0) != order(0, 1)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"n": 0}, "n"),
        ({"batch_size": 0}, "batch_size"),
        ({"seed": -1}, "seed"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": 1.0}, "epoch"),
    ],
)
def test_batch_order_rejects_bad_arguments(kwargs: dict, argument: str) -> None:
    arguments = {"n": 10, "batch_size": 4, "seed": 0, "epoch": 0, **kwargs}
    with pytest.raises(ConfigError, match=argument):
        batch_order(**arguments)


def test_iter_batches_follows_batch_order() -> None:
    split = _indexed(23)
    batches = list(iter_batches(split, batch_size=5, seed=9, epoch=2))
    order = batch_order(23, batch_size=5, seed=9, epoch=2)
    assert len(batches) == len(order) == 5
    for (images, labels), idx in zip(batches, order, strict=True):
        assert torch.equal(labels, idx)
        assert torch.equal(images.view(-1), idx.float())
    assert len(list(iter_batches(split, batch_size=5, seed=9, epoch=2, drop_last=True))) == 4


def test_iter_batches_checks_arguments_at_the_call() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        iter_batches(_indexed(3), batch_size=0, seed=0, epoch=0)


def test_label_counts() -> None:
    split = DataSplit(images=torch.zeros(5, 1, 2, 2), labels=torch.tensor([3, 0, 3, 3, 7]))
    assert label_counts(split) == {0: 1, 3: 3, 7: 1}
    assert list(label_counts(split)) == [0, 3, 7]
