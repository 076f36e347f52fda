"""A vertical party's own model: the front it runs on its own kind of records.

In a vertical job the label party runs the job's model; any other party may run a model
of its own (a lab's table of blood values through ``tabular_mlp`` beside an imaging
site's CNN), named in the job description's ``party_models`` by the party's hospital.
Only that model's front is used: its first segment, cut where the party's entry says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from medsplit.errors import ConfigError, UnknownModelError
from medsplit.models import get_model_spec, is_factory_name
from medsplit.models.factory import canonical_model_args, factory_module
from medsplit.training.setup import JobModel

#: The keys of one party's entry in the JSON form.
KEYS = ("model", "model_args", "input_shape", "cut")
#: The most parties a job's ``party_models`` may name (the coordinator's participant cap).
MAX_PARTY_MODELS = 64
#: The most values one record of a party's own input may have (the coordinator traces a
#: model at no larger input either).
MAX_INPUT_VALUES = 2**21


@dataclass(frozen=True)
class PartyModelSpec:
    """One party's own model.

    Attributes:
        model: a registry model's name, or ``MODULE:FACTORY`` (built only where listed).
        input_shape: one of the party's records: ``(C, H, W[, D])`` for images, ``(F,)``
            for a table of ``F`` numeric columns.
        cut: the submodule its front ends after (one tensor must cross it).
        model_args: a ``MODULE:FACTORY`` model's keyword arguments; none for a registry one.

    Raises:
        ConfigError: any rule above broken, every reason in the message.
    """

    model: str
    input_shape: tuple[int, ...]
    cut: str
    model_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = spec_problems(self.to_json())
        if problems:
            raise ConfigError(f"a party's model is not valid: {'; '.join(problems)}")
        object.__setattr__(self, "input_shape", tuple(self.input_shape))
        args = canonical_model_args(self.model_args) if self.model_args else "{}"
        object.__setattr__(self, "model_args", MappingProxyType(json.loads(args)))

    def to_json(self) -> dict[str, Any]:
        """The entry's JSON form (:func:`spec_from_json` reads it back)."""
        return {
            "model": self.model,
            "model_args": dict(self.model_args),
            "input_shape": list(self.input_shape),
            "cut": self.cut,
        }

    def job_model(self, *, num_classes: int, seed: int) -> JobModel:
        """The party's model as every side builds it, from the job's seed (its classes
        are the job's; its own classifier is never used)."""
        shape = self.input_shape
        return JobModel(
            name=self.model,
            # A table has no sides: its model takes the columns as channels, and the
            # registry's check of spatial_dims wants 2 or 3.
            spatial_dims=max(2, len(shape) - 1),
            in_channels=shape[0],
            num_classes=num_classes,
            input_shape=shape,
            seed=seed,
            model_args=canonical_model_args(self.model_args) if self.model_args else "",
        )


def spec_from_json(data: object) -> PartyModelSpec:
    """One party's entry from its JSON form.

    Raises:
        ConfigError: not an object of :data:`KEYS`, or a rule of :class:`PartyModelSpec`.
    """
    problems = spec_problems(data)
    if problems:
        raise ConfigError(f"a party's model is not valid: {'; '.join(problems)}")
    assert isinstance(data, Mapping)
    return PartyModelSpec(
        model=data["model"],
        input_shape=tuple(data["input_shape"]),
        cut=data["cut"],
        model_args=data.get("model_args") or {},
    )


def spec_problems(data: object) -> list[str]:
    """Every problem of one party's entry in its JSON form; empty when it is valid."""
    if not isinstance(data, Mapping):
        return [f"an object with {', '.join(KEYS)}, not {data!r}"]
    problems = [f"unknown key {k!r} (known: {', '.join(KEYS)})" for k in data if k not in KEYS]
    problems += [f"{k} is required" for k in ("model", "input_shape", "cut") if k not in data]
    model = data.get("model")
    if "model" in data:
        if not isinstance(model, str):
            problems.append(f"model must be a model's name, got {model!r}")
        else:
            try:
                if is_factory_name(model):
                    factory_module(model)  # its form; each party checks its own list
                else:
                    get_model_spec(model)
            except UnknownModelError as e:
                problems.append(str(e))
    shape = data.get("input_shape")
    if "input_shape" in data:
        ints = isinstance(shape, list | tuple) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
        )
        if not ints or not 1 <= len(shape) <= 4:
            problems.append(
                "input_shape must be 1 to 4 positive integers ((F,) for a table, (C, H, W) "
                f"or (C, H, W, D) for images), got {shape!r}"
            )
        else:
            values = math.prod(shape)
            if values > MAX_INPUT_VALUES:
                problems.append(
                    f"input_shape {list(shape)} has {values} values a record, more than "
                    f"{MAX_INPUT_VALUES}"
                )
    cut = data.get("cut")
    if "cut" in data and (not isinstance(cut, str) or not cut):
        problems.append(f"cut must be a submodule's name, got {cut!r}")
    args = data.get("model_args", {})
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        problems.append(f"model_args must be a JSON object, got {args!r}")
    else:
        try:
            text = canonical_model_args(args)
        except ConfigError as e:
            problems.append(str(e))
        else:
            if text != "{}" and isinstance(model, str) and not is_factory_name(model):
                problems.append(
                    f"{model} is a registry model: it takes no model_args (they are the "
                    "keyword arguments of a MODULE:FACTORY model)"
                )
    return problems


def party_models_problems(data: object) -> list[str]:
    """Every problem of a ``party_models`` JSON object (hospital -> entry)."""
    if not isinstance(data, Mapping):
        return [f"must be an object of hospital -> model, got {data!r}"]
    if len(data) > MAX_PARTY_MODELS:
        return [f"names {len(data)} parties, more than {MAX_PARTY_MODELS}"]
    problems = []
    for name, entry in data.items():
        if not isinstance(name, str) or not name:
            problems.append(f"a party is named by its hospital, got {name!r}")
            continue
        problems += [f"{name}: {reason}" for reason in spec_problems(entry)]
    return problems


def party_models_from_json(data: Mapping[str, Any]) -> Mapping[str, PartyModelSpec]:
    """A checked ``party_models`` object as a read-only mapping of specs.

    Raises:
        ConfigError: every problem of :func:`party_models_problems`.
    """
    if isinstance(data, Mapping):
        data = {k: v.to_json() if isinstance(v, PartyModelSpec) else v for k, v in data.items()}
    problems = party_models_problems(data)
    if problems:
        raise ConfigError(f"party_models is not valid: {'; '.join(problems)}")
    return MappingProxyType({name: spec_from_json(data[name]) for name in sorted(data)})


@dataclass(frozen=True)
class PartyFront:
    """A party's own front as every side builds it: hashable, so a process builds the
    job's vertical model once (:func:`medsplit.training.vertical_parts.job_vertical_model`)."""

    party: str
    model: JobModel
    cut: str
