"""``bench/bench_vertical.py``: a tiny real run of both parts (the vertical job equals the
same model trained centrally, the channel's tensor bytes equal the analytic count),
rendered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_vertical  # noqa: E402


@pytest.mark.skipif(
    not (bench_vertical.DATA_DIR / "breastmnist_28.npz").is_file(),
    reason="needs BreastMNIST in ../shared/data",
)
def test_a_tiny_run_of_accuracy_and_traffic_renders(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = ["--datasets", "breastmnist", "--seeds", "0", "--epochs", "1", "--joins", "sum"]
    tiny += ["--limit", "breastmnist=160", "--json"]
    assert bench_vertical.main(tiny) == 0
    result = json.loads(capsys.readouterr().out)
    (seed,) = result["parts"]["accuracy"]["datasets"]["breastmnist"]["per_seed"]
    assert seed["unsplit_sum"]["equal_to_job"] is True
    assert seed["vertical_sum"]["aligned"] == seed["train_records"] == 160
    for row in result["parts"]["traffic"]["rows"]:
        assert row["cut_equals_analytic"] and row["channel_equals_report"], row
        assert 1.0 < row["ratio"] <= bench_vertical.GOAL_TRAFFIC
    text = bench_vertical.markdown(result)
    assert "Traffic per epoch against the analytic cost" in text
    assert "the same multi-input model (sum), central" in text
