"""The agent's per-turn privacy audit, in process: when it is due, and what one turn's
figures hold (numbers only) while the picture grid stays in the work directory and the
job's front is left as the turn left it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import torch

from hospital_agent.data import LocalData
from hospital_agent.privacy_report import TurnPrivacy, audit_due
from medsplit.data import DataSplit, synthetic_split
from medsplit.defenses import ActivationNoise, PrivacyAudit, PrivacyOptions
from medsplit.defenses.accounting import Spent
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.setup import JobModel, client_parties

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_audit_runs_every_n_rounds_and_after_the_last() -> None:
    options = PrivacyOptions(audit=PrivacyAudit(every_rounds=2))
    due = [r for r in range(5) if audit_due(options, round_index=r, rounds=5)]
    assert due == [1, 3, 4]
    assert not audit_due(PrivacyOptions(), round_index=4, rounds=5)


def test_a_turns_figures_are_numbers_and_the_picture_stays_home(tmp_path: Path) -> None:
    options = PrivacyOptions(
        audit=PrivacyAudit(decoder_steps=2, records=16),
        activation_noise=ActivationNoise(noise_multiplier=1.0),
    )
    optimizer = OptimizerConfig(name="sgd", lr=0.1)
    config = TrainingConfig(
        cuts=("pool1", "pool"),
        mode="ushaped",
        client_optimizer=optimizer,
        server_optimizer=optimizer,
    )
    model = JobModel(
        name="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=2,
        input_shape=(1, 28, 28),
        seed=0,
    )
    split = model.split(config)
    parties = client_parties(split, config)
    pool = synthetic_split(40, shape=(1, 28, 28), seed=3)
    images = pool.images.clamp(0, 1)
    data = LocalData(
        DataSplit(images[:24], pool.labels[:24]), DataSplit(images[24:], pool.labels[24:])
    )
    privacy = TurnPrivacy.for_turn(
        job=7,
        round_index=0,
        rounds=1,
        options=options,
        config=config,
        split=split,
        work_dir=tmp_path,
    )
    assert privacy is not None and privacy.scores is not None  # labels at home: scored
    before = {k: v.clone() for k, v in parties["front"].module.state_dict().items()}
    spent = Spent(2.5, 1e-5, 3e-5, 12, 0.1, 1.0)
    figures = privacy.figures(parties, data, spent=spent)

    assert set(figures) == {
        "ssim", "psnr", "baseline_ssim", "baseline_psnr", "distance_correlation",
        "train_records", "val_records", "epsilon", "delta_total", "noise_multiplier",
    }  # fmt: skip
    assert all(isinstance(v, int | float) for v in figures.values())
    assert (figures["train_records"], figures["val_records"]) == (16, 16)
    assert (figures["epsilon"], figures["delta_total"]) == (2.5, 3e-5)
    for name, value in parties["front"].module.state_dict().items():
        assert torch.equal(value, before[name]), f"the audit changed the front's {name}"
    folder = tmp_path / "privacy" / "job-7"
    assert (folder / "round-0.png").read_bytes().startswith(PNG)
    assert json.loads((folder / "round-0.json").read_text()) == figures
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
