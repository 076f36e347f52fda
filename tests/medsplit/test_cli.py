"""The ``medsplit`` command line: ``cuts``, ``verify`` and ``simulate``, and their errors."""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import torch

from medsplit.cli import main
from medsplit.cutting import cut_table
from medsplit.models import build_model, get_model_spec
from tests import zygote


def _table_json(model: str, shape: tuple[int, ...]) -> list[dict[str, object]]:
    built = build_model(model, in_channels=shape[0], num_classes=2, seed=0)
    return [row.to_json() for row in cut_table(built, torch.zeros(1, *shape))]


# --- cuts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "shape"), [("small_cnn", (1, 20, 20)), ("skip_net", (2, 16, 16))]
)
def test_cuts_json_matches_cut_table(capsys, model: str, shape: tuple[int, ...]) -> None:
    rc = main(["cuts", model, "--input-shape", ",".join(map(str, shape)), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out)
    assert isinstance(data, list)
    assert data == _table_json(model, shape)
    assert all({"name", "crossing", "client_params"} <= set(row) for row in data)


def test_cuts_plain_has_a_header_and_one_line_per_cut(capsys) -> None:
    rc = main(["cuts", "skip_net", "--input-shape", "1,16,16"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    rows = _table_json("skip_net", (1, 16, 16))
    header = next(i for i, line in enumerate(lines) if line.startswith("cut "))
    assert "client params" in lines[header]
    assert set(lines[header + 1]) == {"-"}
    body = lines[header + 2 : header + 2 + len(rows)]
    assert [line.split()[0] for line in body] == [row["name"] for row in rows]
    for line, row in zip(body, rows, strict=True):
        assert f"{row['client_params']:,}" in line.split()
        assert line.split()[-1].rstrip(",") in {t["name"] for t in row["crossing"]}
    # Nothing else looks like a row.
    names = {row["name"] for row in rows}
    assert sum(1 for line in lines if line.split() and line.split()[0] in names) == len(rows)


def test_cuts_default_shape_is_the_models(capsys) -> None:
    assert main(["cuts", "small_cnn", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == _table_json("small_cnn", get_model_spec("small_cnn").default_input_shape)


def test_cuts_runs_as_a_module_in_a_subprocess() -> None:
    argv = ["cuts", "small_cnn", "--input-shape", "1,12,12", "--json"]
    result = zygote.run([sys.executable, "-m", "medsplit.cli", *argv], timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == _table_json("small_cnn", (1, 12, 12))


def test_console_script_is_main() -> None:
    (script,) = entry_points(group="console_scripts", name="medsplit")
    assert script.load() is main


def test_cuts_on_an_input_too_small_is_a_clean_error(capsys) -> None:
    rc = main(["cuts", "small_cnn", "--input-shape", "1,2,2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "medsplit cuts: error:" in err
    assert "[1, 1, 2, 2]" in err


@pytest.mark.parametrize("shape", ["1,28", "a,b,c", "0,28,28"])
def test_cuts_bad_input_shape_is_a_usage_error(capsys, shape: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["cuts", "small_cnn", "--input-shape", shape])
    assert e.value.code == 2
    assert shape in capsys.readouterr().err


# --- verify ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_verify_is_exact_without_codec(capsys, mode: str) -> None:
    rc = main(["verify", "small_cnn", "--steps", "6", "--mode", mode, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert report["exact"] is True
    assert report["steps"] == 6
    assert report["compared"] == len(build_model("small_cnn").state_dict())
    assert report["first_difference"] is None


def test_verify_with_augmentation_is_still_exact(capsys) -> None:
    augment = '[{"name": "flip"}, {"name": "rotate", "degrees": 15}, {"name": "scale_intensity"}]'
    rc = main(["verify", "small_cnn", "--steps", "6", "--augment", augment, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["exact"] is True and report["steps"] == 6
    with pytest.raises(SystemExit) as e:
        main(["verify", "small_cnn", "--augment", '[{"name": "flip", "prob": 2}]'])
    assert e.value.code == 2
    assert "prob must be a number in [0.0, 1.0], got 2" in capsys.readouterr().err


def test_verify_with_a_lossy_codec_is_not_exact(capsys) -> None:
    rc = main(["verify", "small_cnn", "--steps", "6", "--codec", "fp16", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert report["exact"] is False
    assert report["first_difference"] in build_model("small_cnn").state_dict()
    assert report["max_abs_difference"] > 0


def test_verify_plain_output_says_exact(capsys) -> None:
    assert main(["verify", "small_cnn", "--steps", "2", "--hospitals", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("exact: 11 tensors identical after 2 steps")
    # A progress bar on stderr counts both runs' steps: 2 split, 2 unsplit.
    assert "verifying" in captured.err and "4/4" in captured.err


def test_verify_json_output_has_no_progress_bar(capsys) -> None:
    assert main(["verify", "small_cnn", "--steps", "2", "--hospitals", "1", "--json"]) == 0
    assert "verifying" not in capsys.readouterr().err


def test_verify_unknown_cut_is_an_error_naming_it(capsys) -> None:
    rc = main(["verify", "small_cnn", "--steps", "2", "--cut", "no_such_layer"])
    assert rc == 2
    assert "'no_such_layer'" in capsys.readouterr().err


# --- simulate --------------------------------------------------------------------------------


def test_simulate_json_reports_rounds(capsys) -> None:
    argv = ["simulate", "--rounds", "1", "--local-epochs", "1", "--samples", "96"]
    rc = main([*argv, "--hospitals", "2", "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    reports = json.loads(captured.out)
    assert isinstance(reports, list)
    assert len(reports) == 1
    (report,) = reports
    assert report["round"] == 0
    # 96 images dealt to 2 hospitals, 48 each, batches of 16: 3 steps each.
    assert report["steps"] == 6
    assert report["samples"] == 96
    # At least the activations at the default cut (pool1) cross, and their gradients back.
    (row,) = cut_table(
        build_model("small_cnn", seed=0), torch.zeros(1, 1, 28, 28), candidates=["pool1"]
    )
    assert report["bytes_up"] >= 96 * row.bytes_per_sample
    assert report["bytes_down"] >= 96 * row.bytes_per_sample
    assert set(report["validation"]) == {"hospital-1", "hospital-2"}
    # 96 // 4 = 24 synthetic validation images, dealt out evenly.
    assert sum(v["samples"] for v in report["validation"].values()) == 24
    for v in report["validation"].values():
        assert 0.0 <= v["accuracy"] <= 1.0
        assert v["loss"] > 0
    assert report["train_loss"] > 0
    assert 0.0 <= report["val_majority_baseline"] <= 1.0


def _write_medmnist(path: Path, *, train: int, val: int, test: int) -> None:
    rng = np.random.default_rng(0)

    def images(n: int) -> np.ndarray:
        return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)

    def labels(n: int) -> np.ndarray:
        return (np.arange(n) % 2).astype(np.int64).reshape(n, 1)

    np.savez(
        path,
        train_images=images(train),
        train_labels=labels(train),
        val_images=images(val),
        val_labels=labels(val),
        test_images=images(test),
        test_labels=labels(test),
    )


def test_simulate_on_a_medmnist_file(capsys, tmp_path: Path) -> None:
    data = tmp_path / "tinymnist.npz"
    _write_medmnist(data, train=64, val=10, test=6)
    argv = ["simulate", "--data", str(data), "--rounds", "1", "--local-epochs", "1"]
    rc = main([*argv, "--hospitals", "2", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    (report,) = json.loads(captured.out)
    # 64 training images, 32 per hospital, batches of 16: 2 steps each.
    assert report["steps"] == 4
    assert report["samples"] == 64
    assert sum(v["samples"] for v in report["validation"].values()) == 10
    assert str(data) in captured.err  # the banner names the data it trains on
    # Labels alternate 0, 1: class 0 is the training majority (the tie's smaller class).
    val_labels = np.load(data)["val_labels"].reshape(-1)
    assert report["val_majority_baseline"] == float((val_labels == 0).mean())


def test_simulate_prints_the_majority_class_baseline_beside_each_accuracy(
    capsys, tmp_path: Path
) -> None:
    data = tmp_path / "tinymnist.npz"
    _write_medmnist(data, train=64, val=10, test=6)
    argv = ["simulate", "--data", str(data), "--rounds", "2", "--local-epochs", "1"]
    assert main([*argv, "--hospitals", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("round")]
    assert len(lines) == 2
    for line in lines:
        assert "val accuracy" in line
        assert "majority-class baseline 0.500 (always class 0)" in line


def test_simulate_missing_data_file(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "not_here.npz"
    rc = main(["simulate", "--data", str(missing), "--rounds", "1", "--json"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    assert f"medsplit simulate: error: {missing}" in captured.err
    assert "no such file" in captured.err


def test_simulate_unknown_cut(capsys) -> None:
    argv = ["simulate", "--samples", "32", "--rounds", "1", "--cut", "no_such_layer", "--json"]
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    assert "medsplit simulate: error:" in captured.err
    assert "'no_such_layer'" in captured.err


# --- known bugs ------------------------------------------------------------------------------


def test_verify_cut_leaving_the_server_no_weights_is_a_clean_error(capsys) -> None:
    rc = main(["verify", "small_cnn", "--steps", "2", "--cut", "fc"])
    assert rc == 2
    assert "'fc'" in capsys.readouterr().err


def test_simulate_synthetic_data_fits_the_model(capsys) -> None:
    argv = ["simulate", "--model", "densenet121", "--samples", "8", "--hospitals", "1"]
    argv += ["--rounds", "1", "--batch-size", "2", "--max-steps-per-turn", "1", "--json"]
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert json.loads(captured.out)[0]["steps"] == 1
