"""Numbers read from shapes that a later segment needs: recomputed there, never sent.

A model that reads ``n = x.shape[0]`` before a cut and uses ``n`` after it needs only
the batch size on the far side, and every tensor crossing a cut is batch-first: the far
side reads the batch size off the first one, and every other dimension of a shape is
fixed by the input shape the model was cut at.
"""

from __future__ import annotations

import math

import torch
from torch import fx

# Reads of a tensor's shape: (op, target) pairs, the tensor being the first argument.
_SHAPE_METHODS = frozenset({"size", "dim", "numel"})
_SHAPE_ATTRS = frozenset({"shape", "ndim"})
_SHAPE_OPS = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default})
# Python arithmetic on such numbers, as fx and export record it.
_NUMBER_MODULES = frozenset({"_operator", "operator", "math", "builtins"})


def is_shape_read(node: fx.Node) -> bool:
    """Whether ``node`` reads the shape (or rank, or size) of the tensor it is given."""
    if node.op == "call_method":
        return node.target in _SHAPE_METHODS
    if node.op == "call_function":
        if node.target is getattr and len(node.args) == 2:
            return node.args[1] in _SHAPE_ATTRS
        return node.target in _SHAPE_OPS
    return False


def number_slice(node: fx.Node) -> list[fx.Node] | None:
    """The nodes that compute ``node`` from shape reads, in graph order, or ``None``
    when ``node`` depends on anything else (a tensor's values, a module's output)."""
    seen: dict[fx.Node, None] = {}

    def visit(n: fx.Node) -> bool:
        if n in seen:
            return True
        if is_shape_read(n):
            seen[n] = None
            return True
        if n.op != "call_function" or _module_of(n.target) not in _NUMBER_MODULES:
            return False
        if not all(visit(parent) for parent in n.all_input_nodes):
            return False
        seen[n] = None
        return True

    if not visit(node):
        return None
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _module_of(target: object) -> str:
    return getattr(target, "__module__", None) or ""


def shape_read(
    reference: torch.Tensor,
    shape: tuple[int, ...],
    batch_first: bool,
    what: str,
    dim: int | None = None,
) -> object:
    """What a shape read of a tensor of ``shape`` gives, with the batch size (when
    ``batch_first``) read off ``reference``, a tensor that crossed the same cut."""
    full = torch.Size((reference.shape[0], *shape[1:]) if batch_first else shape)
    if what in ("dim", "ndim"):
        return len(full)
    if what == "numel":
        return math.prod(full)
    return full if dim is None else full[dim]


def read_kind(node: fx.Node) -> tuple[str, int | None]:
    """``(what, dim)`` for a node :func:`is_shape_read` accepts."""
    if node.op == "call_method":
        what = str(node.target)
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        return what, dim if isinstance(dim, int) else None
    if node.target is getattr:
        return str(node.args[1]), None
    if node.target is torch.ops.aten.sym_numel.default:
        return "numel", None
    return "size", int(node.args[1])  # aten.sym_size.int(tensor, dim)
