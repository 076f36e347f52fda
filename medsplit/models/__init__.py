"""The networks MedSplit can train, built by name from the registry."""

from medsplit.models.registry import ModelSpec, build_model, get_model_spec, model_names

__all__ = ["ModelSpec", "build_model", "get_model_spec", "model_names"]
