"""``bench/bench_privacy.py``: a tiny real run (two cuts and the U-shaped job on a slice
of BreastMNIST), rendered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_privacy  # noqa: E402


@pytest.mark.skipif(
    not (bench_privacy.DATA_DIR / "breastmnist_28.npz").is_file(),
    reason="needs BreastMNIST in ../shared/data",
)
def test_a_tiny_run_measures_each_cut_and_the_ushaped_job(capsys) -> None:
    tiny = ["--datasets", "breastmnist", "--cuts", "conv1,pool", "--train-steps", "4"]
    assert bench_privacy.main([*tiny, "--steps", "3", "--limit", "64", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    data = result["datasets"]["breastmnist"]
    assert [r["cut"] for r in data["rows"]] == ["conv1", "pool"]
    assert data["rows"][0]["activation"] == [16, 28, 28]
    assert data["ushaped"]["cuts"] == ["pool1", "pool"]
    assert set(data["ushaped"]["label_leakage"]) >= {"norm_auc", "norm_strength"}
    text = bench_privacy.markdown(result)
    assert "| BreastMNIST | conv1 | 16×28×28 | **" in text
    assert "Label leakage of an undefended binary U-shaped job" in text
