"""The agent's local test set (hospital_agent/data/testset.py): where it comes from for
each kind of pool, checked like the rest of the data, summarised for the heartbeat."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hospital_agent.data import DataProblem, DataSource, check_data
from hospital_agent.data.testset import (
    TestSettings,
    check_test,
    load_test_for_job,
    local_test_source,
    with_test,
)
from medsplit.errors import ConfigError


def archive(path: Path, *, test: bool = True, test_labels: list[int] | None = None) -> Path:
    rng = np.random.default_rng(0)
    parts = {"train": 12, "val": 4} | ({"test": 6} if test else {})
    arrays = {}
    for split, n in parts.items():
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = test_labels if split == "test" and test_labels else [i % 2 for i in range(n)]
        arrays[f"{split}_labels"] = np.array(labels, dtype=np.uint8).reshape(-1, 1)
    np.savez(path, **arrays)
    return path


def test_a_medmnist_pool_tests_on_its_archives_test_split_by_default(tmp_path: Path) -> None:
    pool = DataSource(kind="medmnist", path=str(archive(tmp_path / "a.npz")))
    source = local_test_source(pool, TestSettings())
    assert source is not None and (source.path, source.split) == (pool.path, "test")
    test = check_test(source)
    summary = with_test(check_data(pool), test).to_json()
    assert summary["split_sizes"]["test"] == 6
    assert summary["test_label_counts"] == {"0": 3, "1": 3}
    assert "test_mask_classes" not in summary


def test_no_test_split_no_test_set_unless_one_is_asked_for(tmp_path: Path) -> None:
    pool = DataSource(kind="medmnist", path=str(archive(tmp_path / "a.npz", test=False)))
    assert local_test_source(pool, TestSettings()) is None
    asked = local_test_source(pool, TestSettings(split="test"))
    with pytest.raises(DataProblem, match="test_images"):
        check_test(asked)
    assert local_test_source(pool, TestSettings(enabled=False)) is None
    assert "test" not in with_test(check_data(pool), None).to_json()["split_sizes"]


def test_the_pools_own_split_or_csv_is_no_test_set(tmp_path: Path) -> None:
    pool = DataSource(kind="medmnist", path=str(archive(tmp_path / "a.npz")), split="test")
    with pytest.raises(ConfigError, match="held apart"):
        local_test_source(pool, TestSettings())
    folder = DataSource(kind="folder", path=str(tmp_path), labels_csv="labels.csv")
    with pytest.raises(ConfigError, match="held apart"):
        local_test_source(folder, TestSettings(labels_csv="labels.csv"))


def test_a_folder_tests_on_a_csv_of_its_own_and_labels_are_checked(tmp_path: Path) -> None:
    for i in range(6):
        Image.fromarray(np.full((28, 28), 40 * i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "labels.csv").write_text("file,label\n0.png,0\n1.png,1\n2.png,0\n3.png,1\n")
    (tmp_path / "test.csv").write_text("file,label\n4.png,0\n5.png,3\n")
    pool = DataSource(kind="folder", path=str(tmp_path))
    assert local_test_source(pool, TestSettings()) is None, "a folder has no test set unless given"
    source = local_test_source(pool, TestSettings(labels_csv="test.csv"))
    assert source is not None and check_test(source).split_sizes["train"] == 2
    with pytest.raises(DataProblem, match="outside the job's classes"):
        load_test_for_job(source, input_shape=(1, 28, 28), num_classes=2, task="classification")


def test_a_synthetic_pool_draws_its_test_images_with_the_next_seed() -> None:
    pool = DataSource(kind="synthetic", samples=20, seed=4)
    assert local_test_source(pool, TestSettings()) is None
    source = local_test_source(pool, TestSettings(samples=8))
    assert source is not None and (source.samples, source.seed) == (8, 5)
    test = load_test_for_job(source, input_shape=(1, 28, 28), num_classes=2, task="classification")
    assert len(test) == 8


def test_a_segmentation_pool_counts_its_test_masks() -> None:
    pool = DataSource(kind="synthetic", samples=6, task="segmentation", shape=(1, 16, 16))
    test = check_test(local_test_source(pool, TestSettings(samples=4)))
    summary = with_test(check_data(pool), test).to_json()
    assert summary["split_sizes"]["test"] == 4
    assert set(summary["test_mask_classes"]) <= {"0", "1"} and "test_label_counts" not in summary
