"""The networks MedSplit can train, built by name from the registry (or, where allowed,
from a ``MODULE:FACTORY`` name)."""

from medsplit.models.factory import (
    ModelModules,
    is_factory_name,
    model_modules,
    parse_model_args,
    require_model_module,
    set_model_modules,
)
from medsplit.models.registry import (
    ModelSpec,
    build_any_model,
    build_model,
    get_model_spec,
    model_names,
)

__all__ = [
    "ModelModules",
    "ModelSpec",
    "build_any_model",
    "build_model",
    "get_model_spec",
    "is_factory_name",
    "model_modules",
    "model_names",
    "parse_model_args",
    "require_model_module",
    "set_model_modules",
]
