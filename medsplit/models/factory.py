"""Models beyond the registry: ``MODULE:FACTORY`` names, built from JSON arguments.

Naming a factory runs its module's code on every party that builds the model, so a
module is imported only when the caller's list of allowed modules holds it (the
coordinator's ``MEDSPLIT_MODEL_MODULES``, an agent's ``model_modules``; DESIGN.md
invariant 8), and the check comes before the import. A party sets its list once, as it
starts (:func:`set_model_modules`); the job's model is built against it
(:class:`medsplit.training.setup.JobModel`).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from medsplit.errors import ConfigError, ModelModuleRefused, UnknownModelError

# A dotted module path, a colon, a dotted attribute path: "monai.networks.nets:ViT".
_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: Most bytes the JSON arguments of a factory may take.
MAX_ARGS_BYTES = 4096
#: Longest ``MODULE:FACTORY`` name (the job API and the job table take this many).
MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class ModelModules:
    """The modules whose factories this process may import, and where they are listed.

    Attributes:
        modules: module names; a listed package allows the modules inside it too.
        setting: the party's setting that lists them, for the message of a refusal.
    """

    modules: tuple[str, ...] = ()
    setting: str = "this party's list of model modules"


#: This process's list: none until the party's start sets it (only registry models).
_ALLOWED = ModelModules()


def model_module_names(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """The module names of a comma-separated setting (or of a list), empty items left out.

    Raises:
        ConfigError: an item that is not a dotted module name (say ``monai.networks``).
    """
    items = (text or "").split(",") if isinstance(text, str | None) else list(text)
    names = tuple(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))
    bad = [name for name in names if not _MODULE.match(name)]
    if bad:
        raise ConfigError(
            f"model modules are dotted module names separated by commas (say "
            f"monai.networks.nets,my_lab.models); not {', '.join(map(repr, bad))}"
        )
    return names


def set_model_modules(modules: str | Iterable[str] | None, *, setting: str) -> ModelModules:
    """Set this process's list of model modules (once, as the party starts) and the name
    of the ``setting`` it comes from; nothing is imported.

    Raises:
        ConfigError: an item that is not a dotted module name.
    """
    global _ALLOWED
    _ALLOWED = ModelModules(model_module_names(modules), setting)
    return _ALLOWED


def model_modules() -> ModelModules:
    """This process's list of model modules (:func:`set_model_modules`)."""
    return _ALLOWED


def require_model_module(name: str) -> None:
    """Nothing, when ``name`` is a registry name or its module is in this process's list.

    Raises:
        UnknownModelError: a malformed ``MODULE:FACTORY`` name.
        ModelModuleRefused: its module is not listed; the message names it and the
            setting that would list it. Nothing was imported.
    """
    if not is_factory_name(name):
        return
    module_name = factory_module(name)
    if not module_allowed(module_name, _ALLOWED.modules):
        raise ModelModuleRefused(_refusal(module_name, _ALLOWED.modules, _ALLOWED.setting))


def _refusal(module: str, allowed: Collection[str], setting: str | None) -> str:
    listed = ", ".join(sorted(allowed)) or "none"
    where = f"; to run it here, add it to {setting}" if setting else ""
    return (
        f"model module {module!r} is not allowed here (allowed: {listed}){where}. A model "
        "module runs code on every party, so each one lists the modules it trusts"
    )


def is_factory_name(name: object) -> bool:
    """Whether ``name`` has the ``MODULE:FACTORY`` form (registry names have no colon)."""
    return isinstance(name, str) and ":" in name


def factory_module(name: str) -> str:
    """The module part of a ``MODULE:FACTORY`` name.

    Raises:
        UnknownModelError: ``name`` is not of that form.
    """
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not _NAME.match(name):
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


def canonical_model_args(model_args: Mapping[str, object]) -> str:
    """``model_args`` as compact JSON with sorted keys: one text for equal arguments (a
    cache key, a job's stored form).

    Raises:
        ConfigError: not a JSON object with text keys, or larger than ``MAX_ARGS_BYTES``.
    """
    if not isinstance(model_args, Mapping) or not all(isinstance(k, str) for k in model_args):
        raise ConfigError(f"model arguments must be a JSON object, got {model_args!r:.100}")
    try:
        text = json.dumps(dict(model_args), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:  # a value JSON has no form for, NaN, a cycle
        raise ConfigError(f"model arguments must be plain JSON values: {e}") from None
    if len(text.encode()) > MAX_ARGS_BYTES:
        raise ConfigError(
            f"model arguments take at most {MAX_ARGS_BYTES} bytes of JSON, got {len(text.encode())}"
        )
    return text


def build_factory_model(
    name: str,
    model_args: Mapping[str, object],
    *,
    allowed_modules: Collection[str] | None,
    setting: str | None = None,
    seed: int | None = None,
) -> nn.Module:
    """Import ``MODULE`` (when allowed) and call ``FACTORY(**model_args)``.

    Args:
        name: ``MODULE:FACTORY``.
        model_args: the factory's keyword arguments, from JSON.
        allowed_modules: the modules that may be imported; ``None`` allows any (the
            command line, where the person running it names their own code).
        setting: where ``allowed_modules`` is configured, for the message of a refusal.
        seed: with a seed, the weights are drawn from it, the global RNG left as it was.

    Raises:
        ModelModuleRefused: a module not allowed (refused before it is imported).
        UnknownModelError: a malformed name, a missing module or factory.
        ConfigError: the factory refuses the arguments or does not return a module.
    """
    module_name = factory_module(name)
    if allowed_modules is not None and not module_allowed(module_name, allowed_modules):
        raise ModelModuleRefused(_refusal(module_name, allowed_modules, setting))
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
