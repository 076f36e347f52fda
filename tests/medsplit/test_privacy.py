"""The privacy audit's measurements (``medsplit/privacy``): distance correlation against
the reference library, inversion that succeeds where it should and fails where it
should, label leakage of a U-shaped job, determinism."""

from __future__ import annotations

from collections import OrderedDict

import dcor
import pytest
import torch
from torch import nn

from medsplit.data import DataSplit, synthetic_split
from medsplit.errors import CutError
from medsplit.models import build_model
from medsplit.privacy import (
    AuditSettings,
    InversionSettings,
    audit_cut,
    distance_correlation,
    u_distance_correlation_sqr,
)
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig

ADAM = OptimizerConfig(name="adam", lr=0.002)
SHAPE = (1, 16, 16)


def _splits(n: int = 200, *, keep: torch.Tensor | None = None) -> tuple[DataSplit, DataSplit]:
    pool = synthetic_split(n, shape=SHAPE, seed=0)
    if keep is not None:
        pool = DataSplit(pool.images[keep], pool.labels[keep])
    cut = len(pool) * 4 // 5
    return (
        DataSplit(pool.images[:cut], pool.labels[:cut]),
        DataSplit(pool.images[cut:], pool.labels[cut:]),
    )


def _config(*cuts: str, mode: str = "vanilla") -> TrainingConfig:
    return TrainingConfig(
        cuts=cuts, mode=mode, client_optimizer=ADAM, server_optimizer=ADAM, batch_size=16
    )


def _settings(*, train_steps: int = 0, steps: int = 80, **kw: object) -> AuditSettings:
    return AuditSettings(
        train_steps=train_steps, inversion=InversionSettings(steps=steps, width=16), **kw
    )


def test_distance_correlation_agrees_with_dcor_in_float64() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(150, 1, 6, 6, generator=g, dtype=torch.float64)
    mix = torch.randn(36, 10, generator=g, dtype=torch.float64)
    y = torch.relu(x.reshape(150, -1) @ mix) + 0.3 * torch.randn(150, 10, generator=g).double()
    xs, ys = x.reshape(150, -1).numpy(), y.numpy()
    # Against a reference implementation the last digits differ by summation order, so a
    # float64 tolerance is the right comparison here (and only here).
    # chunk=37 makes the rows come in uneven chunks, as on large splits.
    assert distance_correlation(x, y, chunk=37) == pytest.approx(
        dcor.distance_correlation(xs, ys), rel=1e-10, abs=1e-12
    )
    assert u_distance_correlation_sqr(x, y, chunk=37) == pytest.approx(
        dcor.u_distance_correlation_sqr(xs, ys), rel=1e-10, abs=1e-12
    )
    # The unbiased estimator tells independent noise (about 0) from the activations.
    noise = torch.randn(150, 10, generator=g, dtype=torch.float64)
    assert abs(u_distance_correlation_sqr(x, noise)) < 0.05 < u_distance_correlation_sqr(x, y)


def _constant_front_model() -> nn.Sequential:
    """A front whose output ignores the input (zero weights, a bias): nothing to invert."""
    front = nn.Conv2d(1, 4, 3, padding=1)
    with torch.no_grad():
        front.weight.zero_()
    return nn.Sequential(
        OrderedDict(
            front=front,
            conv=nn.Conv2d(4, 4, 3, padding=1),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            fc=nn.Linear(4, 2),
        )
    )


def test_the_first_convolution_inverts_and_a_constant_front_does_not() -> None:
    train, val = _splits(120)
    small_cnn = build_model("small_cnn", in_channels=1, num_classes=2, seed=0)
    early = audit_cut(small_cnn, train, val, _config("conv1"), _settings())
    blind = audit_cut(_constant_front_model(), train, val, _config("front"), _settings())
    assert early.activation == (16, 16, 16)
    assert early.ssim > 0.9 and early.distance_correlation > 0.9
    assert blind.ssim < 0.3 and blind.distance_correlation == 0.0
    assert early.psnr > blind.psnr + 5
    # The constant front tells the decoder nothing: it does no better than the mean image.
    assert blind.ssim < blind.baseline_ssim + 0.05 < early.ssim


def test_the_norm_attack_recovers_the_labels_of_an_undefended_ushaped_job() -> None:
    # Separable stripes, four in five images of class 1: the rarer class's gradients at
    # the second cut are the larger ones (Li et al.'s setting).
    labels = synthetic_split(320, shape=SHAPE, seed=0).labels
    keep = (labels == 1) | (torch.arange(320) % 4 == 0)
    train, val = _splits(320, keep=keep)
    model = build_model("small_cnn", in_channels=1, num_classes=2, seed=0)
    report = audit_cut(
        model,
        train,
        val,
        _config("pool1", "pool", mode="ushaped"),
        _settings(train_steps=10, steps=1),
    )
    assert report.labels == "hospital"
    assert report.label_leakage is not None
    # Larger norms mean class 0 here, so the AUC is near 0: a strength near 1.
    assert report.label_leakage["norm_strength"] > 0.95
    assert report.label_leakage["norm_auc"] < 0.05


def test_labels_that_travel_give_no_auc() -> None:
    train, val = _splits(100)
    model = build_model("small_cnn", in_channels=1, num_classes=2, seed=0)
    report = audit_cut(model, train, val, _config("pool1"), _settings(train_steps=2, steps=1))
    assert report.labels == "server" and report.label_leakage is None
    assert "labels travel" in report.label_leakage_note


def test_two_seeded_audits_give_the_same_figures(tmp_path) -> None:
    train, val = _splits(100)
    runs = []
    for i in range(2):
        model = build_model("small_cnn", in_channels=1, num_classes=2, seed=0)
        settings = _settings(train_steps=3, steps=5, picture=tmp_path / f"{i}.png")
        runs.append(audit_cut(model, train, val, _config("pool1"), settings))
    a, b = (r.to_json() for r in runs)
    assert a.pop("picture") != b.pop("picture")
    assert a == b
    assert (tmp_path / "0.png").read_bytes() == (tmp_path / "1.png").read_bytes()


def test_a_cut_two_tensors_cross_is_refused_naming_them() -> None:
    train, val = _splits(60)
    model = build_model("skip_net", in_channels=1, num_classes=2, seed=0)
    with pytest.raises(CutError, match=r"2 tensors cross cut 'block1' \(stem, block1\)"):
        audit_cut(model, train, val, _config("block1"), _settings())
