"""``medsplit-agent privacy-audit``: a real agent process audits a cut on its own
(synthetic) data, offline, and keeps the figures and the picture in its work directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from hospital_agent.cli import main
from medsplit.models import model_modules, set_model_modules
from tests import zygote

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "agent.toml"
    # Port 9 answers nothing: the audit must not need the coordinator.
    config.write_text(
        'coordinator_url = "http://127.0.0.1:9"\n'
        f'work_dir = "{tmp_path / "work"}"\n'
        '[data]\nkind = "synthetic"\nsamples = 80\nshape = [1, 16, 16]\n'
    )
    return config


def _agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = _config(tmp_path)
    command = [sys.executable, "-m", "hospital_agent", "privacy-audit", "--config", str(config)]
    return zygote.run([*command, *args], timeout=120, cwd=ROOT, env=os.environ)


def test_the_audit_prints_the_figures_and_keeps_the_picture_at_home(tmp_path: Path) -> None:
    tiny = ["--train-steps", "3", "--decoder-steps", "5", "--batch-size", "16"]
    done = _agent(tmp_path, "--model", "small_cnn", "--mode", "ushaped", "--json", *tiny)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    folder = tmp_path / "work" / "privacy"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    stem = "small_cnn-ushaped-pool1+pool"
    assert json.loads((folder / f"{stem}.json").read_text()) == printed
    assert printed["picture"] == str(folder / f"{stem}.png")
    # The agent's own split: 80 images, a fifth of each label kept for validation.
    assert (printed["train_records"], printed["val_records"]) == (64, 16)
    assert printed["label_leakage"]["norm_auc"] is not None
    with Image.open(folder / f"{stem}.png") as image:
        assert image.size == (8 * 16 * 4, 2 * 16 * 4)


def test_a_cut_two_tensors_cross_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command's own entry point, in process (the process above shows it runs as one);
    # it sets this process's model modules as an agent's start does: put back after.
    command = ["privacy-audit", "--config", str(_config(tmp_path))]
    before = model_modules()
    try:
        assert main([*command, "--model", "skip_net", "--cut", "block1"]) == 2
    finally:
        set_model_modules(before.modules, setting=before.setting)
    assert "2 tensors cross cut 'block1'" in capsys.readouterr().err
    assert not list((tmp_path / "work" / "privacy").glob("*.png"))
