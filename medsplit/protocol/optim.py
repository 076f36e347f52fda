"""Optimizer and learning-rate schedule of one party, built from a plain config."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, ExponentialLR, LRScheduler, StepLR

from medsplit.errors import ConfigError

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine", "exponential")


@dataclass(frozen=True)
class OptimizerConfig:
    """How one party updates its weights; the schedule advances once per training step.

    Attributes:
        name: ``sgd`` (with optional momentum), ``adam`` or ``adamw``.
        lr: learning rate, > 0.
        momentum: SGD momentum in [0, 1).
        weight_decay: >= 0.
        betas: Adam(W) coefficients, each in [0, 1).
        schedule: ``constant``, ``step`` (times ``gamma`` every ``step_size`` steps),
            ``cosine`` (to 0 over ``total_steps``) or ``exponential`` (times ``gamma`` per step).
    """

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "constant"
    step_size: int = 100
    gamma: float = 0.5
    total_steps: int = 1000

    @classmethod
    def from_json(cls, values: dict) -> OptimizerConfig:
        """From its JSON form, as the coordinator stores and sends it (betas as a list)."""
        values = dict(values)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optimizer name must be one of {OPTIMIZERS}, got {self.name!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.step_size < 1 or self.total_steps < 1:
            raise ConfigError("step_size and total_steps must be at least 1")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"gamma must be in (0, 1], got {self.gamma}")


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """A fresh optimizer over ``params``.

    The single-tensor implementations are chosen explicitly (``foreach=False``): their
    per-parameter arithmetic does not depend on which other parameters share the
    optimizer, which is what lets split training match unsplit training bit for bit.
    """
    params = list(params)
    if config.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            foreach=False,
        )
    cls = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
    return cls(
        params,
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        foreach=False,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimizerConfig
) -> LRScheduler | None:
    """The learning-rate schedule of ``config``, or ``None`` for a constant rate."""
    if config.schedule == "step":
        return StepLR(optimizer, step_size=config.step_size, gamma=config.gamma)
    if config.schedule == "cosine":
        return CosineAnnealingLR(optimizer, T_max=config.total_steps)
    if config.schedule == "exponential":
        return ExponentialLR(optimizer, gamma=config.gamma)
    return None
