"""Models beyond the registry: ``MODULE:FACTORY`` names, built from JSON arguments.

Naming a factory runs its module's code on every party that builds the model, so a
module is imported only when the caller's list of allowed modules holds it (the
coordinator's ``MEDSPLIT_MODEL_MODULES``, an agent's ``model_modules``; DESIGN.md
invariant 8), and the check comes before the import.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Collection, Mapping

import torch
from torch import nn

from medsplit.errors import ConfigError, UnknownModelError

# A dotted module path, a colon, a dotted attribute path: "monai.networks.nets:ViT".
_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: Most bytes the JSON arguments of a factory may take.
MAX_ARGS_BYTES = 4096


def is_factory_name(name: object) -> bool:
    """Whether ``name`` has the ``MODULE:FACTORY`` form (registry names have no colon)."""
    return isinstance(name, str) and ":" in name


def factory_module(name: str) -> str:
    """The module part of a ``MODULE:FACTORY`` name.

    Raises:
        UnknownModelError: ``name`` is not of that form.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnknownModelError(
            f"{name!r} is not a model name of the form MODULE:FACTORY (say monai.networks.nets:ViT)"
        )
    return name.split(":", 1)[0]


def module_allowed(module: str, allowed: Collection[str]) -> bool:
    """Whether ``module`` is listed, or lies inside a listed package."""
    return any(module == a or module.startswith(a + ".") for a in allowed)


def parse_model_args(text: str | None) -> dict[str, object]:
    """The JSON object of a factory's keyword arguments (``None``: none).

    Raises:
        ConfigError: not a JSON object, or larger than ``MAX_ARGS_BYTES``.
    """
    if text is None or text == "":
        return {}
    if len(text.encode()) > MAX_ARGS_BYTES:
        raise ConfigError(f"model arguments take at most {MAX_ARGS_BYTES} bytes of JSON")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"model arguments are not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"model arguments must be a JSON object, got {type(value).__name__}")
    return value


def build_factory_model(
    name: str,
    model_args: Mapping[str, object],
    *,
    allowed_modules: Collection[str] | None,
    seed: int | None = None,
) -> nn.Module:
    """Import ``MODULE`` (when allowed) and call ``FACTORY(**model_args)``.

    Args:
        name: ``MODULE:FACTORY``.
        model_args: the factory's keyword arguments, from JSON.
        allowed_modules: the modules that may be imported; ``None`` allows any (the
            command line, where the person running it names their own code).
        seed: with a seed, the weights are drawn from it, the global RNG left as it was.

    Raises:
        UnknownModelError: a malformed name, a module not allowed (refused before it is
            imported), a missing module or factory.
        ConfigError: the factory refuses the arguments or does not return a module.
    """
    module_name = factory_module(name)
    if allowed_modules is not None and not module_allowed(module_name, allowed_modules):
        listed = ", ".join(sorted(allowed_modules)) or "none"
        raise UnknownModelError(
            f"model module {module_name!r} is not allowed here (allowed: {listed}); "
            "a model module runs code on every party, so each one lists the modules it trusts"
        )
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownModelError(f"cannot import model module {module_name!r}: {e}") from e
    for atom in name.split(":", 1)[1].split("."):
        if not hasattr(target, atom):
            raise UnknownModelError(f"{module_name!r} has no {name.split(':', 1)[1]!r}")
        target = getattr(target, atom)
    if not callable(target):
        raise UnknownModelError(f"{name!r} is not callable")
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        try:
            model = target(**model_args)
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"{name} refuses the model arguments {dict(model_args)}: {e}") from e
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{name} returned a {type(model).__name__}, not a torch.nn.Module")
    return model
