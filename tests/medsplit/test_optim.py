"""Optimizer configs: checked at construction, built as the single-tensor implementations."""

from __future__ import annotations

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, ExponentialLR, StepLR

from medsplit.errors import ConfigError
from medsplit.protocol.optim import OptimizerConfig, build_optimizer, build_scheduler
from medsplit.training.config import TrainingConfig


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"name": "rmsprop"}, "optimizer name"),
        ({"lr": 0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -1}, "weight_decay"),
        ({"betas": (0.9, 1.5)}, "betas"),
        ({"schedule": "warmup"}, "schedule"),
        ({"gamma": 0}, "gamma"),
    ],
)
def test_bad_optimizer_settings_name_the_argument(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        OptimizerConfig(**kwargs)


@pytest.mark.parametrize(
    ("name", "cls"),
    [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)],
)
def test_optimizers_are_single_tensor(name: str, cls: type) -> None:
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimizerConfig(name=name))
    assert isinstance(opt, cls)
    assert opt.param_groups[0]["foreach"] is False


@pytest.mark.parametrize(
    ("schedule", "cls"),
    [
        ("constant", type(None)),
        ("step", StepLR),
        ("cosine", CosineAnnealingLR),
        ("exponential", ExponentialLR),
    ],
)
def test_schedules(schedule: str, cls: type) -> None:
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimizerConfig())
    assert isinstance(build_scheduler(opt, OptimizerConfig(schedule=schedule)), cls)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"cuts": ("a", "b")}, "vanilla mode needs 1 cut"),
        ({"cuts": ("a",), "mode": "ushaped"}, "ushaped mode needs 2 cut"),
        ({"cuts": ("a",), "mode": "diagonal"}, "unknown mode 'diagonal'; known modes: vanilla"),
        ({"cuts": ("a",), "mode": "diagonal"}, "unknown mode 'diagonal'"),
        ({"cuts": ("a",), "batch_size": 0}, "batch_size"),
        ({"cuts": ("a",), "rounds": 0}, "rounds"),
        ({"cuts": ("a",), "job": "bad job!"}, "job id"),
        ({"cuts": ("a",), "seed": -1}, "seed"),
    ],
)
def test_bad_training_settings_name_the_argument(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        TrainingConfig(**kwargs)


def test_a_single_cut_may_be_given_as_a_string() -> None:
    config = TrainingConfig(cuts="layer1", mode="vanilla")  # type: ignore[arg-type]
    assert config.cuts == ("layer1",) and config.mode == "vanilla"


def test_the_description_of_the_optimizers_covers_each_and_its_defaults() -> None:
    from medsplit.protocol.optim import OPTIMIZERS, SCHEDULES, describe_optimizers

    described = describe_optimizers()
    assert [o["name"] for o in described["optimizers"]] == list(OPTIMIZERS)
    assert [s["name"] for s in described["schedules"]] == list(SCHEDULES)
    sgd = {o["name"]: o for o in described["optimizers"][0]["options"]}
    assert sgd["lr"] == {
        "name": "lr",
        "type": "float",
        "default": 0.01,
        "help": "learning rate, > 0",
    }
    assert "momentum" in sgd and "betas" not in sgd
    adam = {o["name"]: o for o in described["optimizers"][1]["options"]}
    assert adam["betas"]["default"] == [0.9, 0.999] and adam["betas"]["type"] == "list"
    assert described["defaults"] == OptimizerConfig().to_json()
    assert OptimizerConfig.from_json(described["defaults"]) == OptimizerConfig()
