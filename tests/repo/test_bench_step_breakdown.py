"""``bench/bench_step_breakdown.py``: a tiny real run over Redis, every piece timed, both
wire versions training the same weights as the unsplit model, rendered; and ``--compare``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_step_breakdown  # noqa: E402

from tests.redis_server import redis_url  # noqa: E402, F401

TINY = ["--repeats", "3", "--warmup", "1", "--batch-size", "8"]


def test_a_tiny_run_times_every_piece_and_trains_the_unsplit_weights(
    redis_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*TINY, "--url", redis_url, "--baseline", "HEAD", "--json"]
    assert bench_step_breakdown.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["columns"]) == {"now", "baseline"}
    for column in result["columns"].values():
        assert set(column["pieces_ms"]) == set(bench_step_breakdown.PIECES)
        assert all(ms > 0 for ms in column["pieces_ms"].values())
        assert column["same_weights_as_unsplit"] is True
    assert result["bytes"]["up"] > 8 * 16 * 14 * 14 * 4  # the activations at pool1, float32
    text = bench_step_breakdown.markdown(result)
    assert "| **sum: split step in one process** |" in text
    assert "now yes, at HEAD yes" in text


def test_compare_pools_child_runs_before_and_after(
    redis_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_step_breakdown.main([*TINY, "--url", redis_url, "--compare", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["columns"]) == {"before", "after"}
    assert all(c["same_weights_as_unsplit"] is True for c in result["columns"].values())
    assert "| front |" in bench_step_breakdown.markdown(result)


def test_the_pure_python_parser_is_timed_beside_hiredis(
    redis_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*TINY, "--url", redis_url, "--python-parser", "--json"]
    assert bench_step_breakdown.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["columns"]) == {"now", "python"}
    assert all(c["same_weights_as_unsplit"] is True for c in result["columns"].values())
    assert all(c["set_get_ms"]["up"] > 0 for c in result["columns"].values())
    text = bench_step_breakdown.markdown(result)
    assert "| now, hiredis | now, pure-Python parser |" in text
