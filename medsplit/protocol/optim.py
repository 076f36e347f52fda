"""Optimizer and learning-rate schedule of one party, built from a plain config."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

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
    def from_json(cls, values: Mapping[str, Any]) -> OptimizerConfig:
        """From its JSON form (betas as a list); fields left out take their defaults.

        Raises:
            ConfigError: not an object, an unknown option, a value of the wrong type, or
                one out of range; the message names the option.
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"an optimizer is a JSON object, got {type(values).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; options: {', '.join(sorted(known))}")
        args = dict(values)
        for key, value in args.items():
            wrong_type = isinstance(value, bool) or not isinstance(value, _JSON_TYPES[key])
            if wrong_type or (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"{key} has the wrong type or value: {value!r}")
        if "betas" in args:
            betas = args["betas"]
            if len(betas) != 2 or not all(_is_number(b) for b in betas):
                raise ConfigError(f"betas must be two numbers in [0, 1), got {betas!r}")
            args["betas"] = tuple(betas)
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        """Every field, betas as a list: what :meth:`from_json` reads back."""
        values = asdict(self)
        values["betas"] = list(values["betas"])
        return values

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


#: The JSON type of each option (an int is a float too; a bool is neither).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "lr": (int, float),
    "momentum": (int, float),
    "weight_decay": (int, float),
    "betas": (list, tuple),
    "schedule": (str,),
    "step_size": (int,),
    "gamma": (int, float),
    "total_steps": (int,),
}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class OptionInfo:
    """One option of :class:`OptimizerConfig`, for the forms built from it."""

    name: str
    type: str
    default: Any
    help: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "default": self.default, "help": self.help}


_HELP = {
    "lr": "learning rate, > 0",
    "momentum": "momentum, in [0, 1)",
    "weight_decay": "L2 penalty, >= 0",
    "betas": "the two Adam coefficients, each in [0, 1)",
    "step_size": "steps between two multiplications by gamma",
    "gamma": "the factor the rate is multiplied by, in (0, 1]",
    "total_steps": "steps over which the rate falls to 0",
}

#: The options each optimizer and each schedule reads (the others it ignores).
OPTIMIZER_OPTIONS: dict[str, tuple[str, ...]] = {
    "sgd": ("lr", "momentum", "weight_decay"),
    "adam": ("lr", "betas", "weight_decay"),
    "adamw": ("lr", "betas", "weight_decay"),
}
SCHEDULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "step": ("step_size", "gamma"),
    "cosine": ("total_steps",),
    "exponential": ("gamma",),
}
_TITLES = {
    "sgd": "SGD (with optional momentum)",
    "adam": "Adam",
    "adamw": "AdamW (decoupled weight decay)",
    "constant": "a constant rate",
    "step": "times gamma every step_size steps",
    "cosine": "cosine to 0 over total_steps",
    "exponential": "times gamma every step",
}


def describe_optimizers() -> dict[str, Any]:
    """The optimizers and schedules a party may use, each with the options it reads and
    their defaults (``GET /api/optimizers/``, the dashboard's form)."""
    defaults = OptimizerConfig().to_json()
    types = {f.name: f.type for f in fields(OptimizerConfig)}

    def options(names: tuple[str, ...]) -> list[dict[str, Any]]:
        return [OptionInfo(n, _type_name(types[n]), defaults[n], _HELP[n]).to_json() for n in names]

    return {
        "optimizers": [
            {"name": n, "title": _TITLES[n], "options": options(OPTIMIZER_OPTIONS[n])}
            for n in OPTIMIZERS
        ],
        "schedules": [
            {"name": n, "title": _TITLES[n], "options": options(SCHEDULE_OPTIONS[n])}
            for n in SCHEDULES
        ],
        "defaults": defaults,
    }


def _type_name(annotation: object) -> str:
    # The dataclass's annotations are strings (``from __future__ import annotations``).
    text = str(annotation)
    return {"float": "float", "int": "int", "str": "str"}.get(text, "list")


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
