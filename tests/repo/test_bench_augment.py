"""``bench/bench_augment.py``: a tiny real run (jobs with and without augmentation on
BreastMNIST, the augmented one equal to unsplit training on the same batches), rendered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_augment  # noqa: E402


@pytest.mark.skipif(
    not (bench_augment.DATA_DIR / bench_augment.FILE).is_file(),
    reason="needs BreastMNIST in ../shared/data",
)
def test_a_tiny_run_with_and_without_augmentation_renders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tiny = ["--seeds", "0", "--epochs", "1", "--limit", "96", "--presets", "none,flip + rotate"]
    assert bench_augment.main([*tiny, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (seed,) = result["per_seed"]
    assert seed["train"] == 96 and seed["none"]["exact_vs_unsplit_same_batches"] is None
    assert seed["flip + rotate"]["exact_vs_unsplit_same_batches"] is True
    assert result["summary"]["flip + rotate"]["exact_every_checked_run"] is True
    text = bench_augment.markdown(result)
    assert "| flip + rotate |" in text and "**yes** (augmented jobs checked: 1;" in text
    assert text.startswith("Measured ")
