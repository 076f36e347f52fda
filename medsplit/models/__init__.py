"""The networks MedSplit can train, built by name from the registry (or, where allowed,
from a ``MODULE:FACTORY`` name)."""

from medsplit.models.factory import is_factory_name, parse_model_args
from medsplit.models.registry import (
    ModelSpec,
    build_any_model,
    build_model,
    get_model_spec,
    model_names,
)

__all__ = [
    "ModelSpec",
    "build_any_model",
    "build_model",
    "get_model_spec",
    "is_factory_name",
    "model_names",
    "parse_model_args",
]
