"""Trace a model into a torch.fx graph and read facts off its nodes."""

from __future__ import annotations

import copy

import torch
from torch import fx
from torch.fx.proxy import TraceError

from medsplit.errors import CutError


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """Symbolically trace a deep copy of ``model``; the user's model is never touched.

    Raises:
        CutError: the forward pass cannot be traced, typically because Python control
            flow depends on tensor values (``if x.sum() > 0:``), which no static cut
            can honour.
    """
    if not isinstance(model, torch.nn.Module):
        raise CutError(f"expected a torch.nn.Module to cut, got {type(model).__name__}")
    owned = copy.deepcopy(model)
    try:
        return fx.symbolic_trace(owned)
    except TraceError as e:
        raise CutError(
            f"{type(model).__name__} cannot be cut: its forward pass has a data-dependent "
            f"branch or loop that torch.fx cannot trace ({e}). Move the branch into a "
            "submodule on one side of the cut or make it depend on attributes, not tensor values."
        ) from e
    except Exception as e:  # fx raises plain errors for many unsupported constructs
        raise CutError(f"{type(model).__name__} cannot be traced by torch.fx: {e}") from e


def module_path_stack(node: fx.Node) -> list[str]:
    """Qualified names of the modules this node was traced inside, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [value[0] if isinstance(value, tuple) else key for key, value in stack.items()]
    if node.op == "call_module" and node.target not in paths:
        paths.append(str(node.target))
    return paths


def owned_state(root: torch.nn.Module, node: fx.Node) -> dict[str, torch.Tensor]:
    """Parameters and buffers a node reads, by qualified name (empty for pure functions)."""
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        prefix = str(node.target)
        return {
            **dict(module.named_parameters(prefix=prefix)),
            **dict(module.named_buffers(prefix=prefix)),
        }
    if node.op == "get_attr":
        value = _get_attr(root, str(node.target))
        if isinstance(value, torch.Tensor):
            return {str(node.target): value}
    return {}


def _get_attr(root: torch.nn.Module, target: str) -> object:
    value: object = root
    for atom in target.split("."):
        value = getattr(value, atom)
    return value
