"""The agent's side of predictions that runs offline: the images read and fitted as
training reads a folder, a file that does not fit named, and the CSV and masks written
whole or not at all."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.transforms import Resize, ScaleIntensity
from PIL import Image

from hospital_agent.cli import main
from hospital_agent.data import DataProblem
from hospital_agent.data.sources import read_image
from hospital_agent.data.transforms import load_for_prediction
from hospital_agent.predict import _write


def png(path: Path, size: tuple[int, int], mode: str = "L") -> str:
    rng = np.random.default_rng(len(str(path)))
    shape = (*size, 3) if mode == "RGB" else size
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode).save(path)
    return str(path)


def test_images_are_fitted_as_a_folders_training_images_are(tmp_path: Path) -> None:
    paths = [png(tmp_path / "a.png", (40, 40)), png(tmp_path / "b.png", (28, 28))]
    got = load_for_prediction(paths, input_shape=(1, 28, 28))
    assert got.shape == (2, 1, 28, 28) and got.dtype == torch.float32
    scale, resize = ScaleIntensity(minv=0.0, maxv=1.0), Resize((28, 28), mode="bilinear")
    want = scale(resize(scale(read_image(paths[0]))))
    assert torch.equal(got[0], torch.as_tensor(want))
    assert float(got.min()) == 0.0 and float(got.max()) == 1.0


def test_an_image_of_other_channels_is_named(tmp_path: Path) -> None:
    rgb = png(tmp_path / "colour.png", (28, 28), mode="RGB")
    with pytest.raises(DataProblem, match=r"colour\.png.*other channels or dimensions"):
        load_for_prediction([png(tmp_path / "ok.png", (28, 28)), rgb], input_shape=(1, 28, 28))


def test_the_csv_holds_each_images_class_and_probabilities(tmp_path: Path) -> None:
    out = tmp_path / "out" / "p.csv"
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    assert _write(out, ("x.png", "y.png"), logits, segmentation=False) is None
    rows = list(csv.DictReader(out.open()))
    assert [(r["path"], r["predicted"]) for r in rows] == [("x.png", "0"), ("y.png", "1")]
    assert float(rows[0]["p_0"]) == pytest.approx(torch.softmax(logits[0], 0)[0].item(), abs=1e-6)
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_a_segmentation_jobs_masks_are_pngs_beside_the_csv(tmp_path: Path) -> None:
    out = tmp_path / "seg.csv"
    logits = torch.zeros(2, 3, 4, 4)
    logits[0, 2] = 1.0  # every pixel of the first image is class 2
    folder = _write(out, ("a.png", "b.png"), logits, segmentation=True)
    assert folder == tmp_path / "seg_masks"
    rows = list(csv.DictReader(out.open()))
    mask = np.asarray(Image.open(folder / rows[0]["mask"]))
    assert (mask == 2).all() and float(rows[0]["fraction_2"]) == 1.0


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "predict",
            "--work-dir",
            str(tmp_path / "work"),
            "--coordinator-url",
            "https://coordinator.invalid",
            "--data-kind",
            "synthetic",
            "--data-samples",
            "10",
            "--out",
            str(tmp_path / "p.csv"),
            str(tmp_path / "missing.png"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("medsplit-agent predict: ")
    assert "--job" in err[0]
    assert not (tmp_path / "p.csv").exists()
