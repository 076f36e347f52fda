"""``bench/bench_splitfed.py``: the critical path it computes for each run, and a tiny real
run of its round-time and masking parts (the clocks it wraps around a job's roles still
fit the job), rendered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_splitfed  # noqa: E402

ROUND = {"turn_cpu_s": {0: 0.2, 1: 0.5, 2: 0.3}, "server_cpu_s": 0.7}


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("roundrobin", 1.0),  # the turns one after another
        ("sflv1", 0.5 + 0.1),  # the slowest turn, then the aggregation
        ("sflv2", 0.7 + 0.1),  # the one server segment serves every step
    ],
)
def test_critical_path_of_each_run(run: str, expected: float) -> None:
    assert bench_splitfed.critical_path(run, ROUND, 0.1) == pytest.approx(expected)


@pytest.mark.skipif(
    not (bench_splitfed.DATA_DIR / "pneumoniamnist_28_reconstructed.npz").is_file(),
    reason="needs PneumoniaMNIST in ../shared/data",
)
def test_a_tiny_run_of_rounds_and_masking_renders(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = ["--parts", "masking,rounds", "--ks", "3", "--repeats", "1", "--round-ks", "3"]
    tiny += ["--steps", "2", "--rounds", "2", "--passes", "1", "--seeds", "0", "--json"]
    assert bench_splitfed.main(tiny) == 0
    result = json.loads(capsys.readouterr().out)
    (config,) = result["parts"]["rounds"]["configurations"]
    for run in ("roundrobin", "sflv1", "sflv2"):
        assert config["runs"][run]["slowest_turn_cpu_s"] > 0
    assert config["runs"]["sflv1"]["secure_s"] > 0  # the real secure aggregation ran
    text = bench_splitfed.markdown(result)
    assert "Cost of masking" in text and "critical path / round-robin" in text
