"""``bench/bench_segmentation.py``: a tiny real run of both parts (the U-shaped UNet job
equals unsplit training on its batches, the channel's tensor bytes equal the analytic
count with every skip tensor), rendered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_segmentation  # noqa: E402


def test_a_tiny_run_of_dice_and_traffic_renders(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = ["--seeds", "0", "--epochs", "1", "--train", "48", "--test", "16", "--json"]
    assert bench_segmentation.main(tiny) == 0
    result = json.loads(capsys.readouterr().out)
    dice = result["parts"]["dice"]
    assert dice["exact"] is True
    assert 0.0 <= dice["ushaped"]["mean"] <= 1.0
    for row in result["parts"]["traffic"]["rows"]:
        assert row["cut_equals_analytic"] and row["channel_equals_report"], row
        assert len(row["first_cut"]) == 2  # the skip tensor crosses too
        assert row["analytic_without_skips"] < row["analytic"]
        assert 1.0 < row["ratio"] <= bench_segmentation.GOAL_TRAFFIC
    text = bench_segmentation.markdown(result)
    assert "Traffic per epoch against the analytic cost" in text
    assert "U-shaped job, 3 hospitals" in text
