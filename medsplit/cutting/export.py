"""Turn a model into a plain torch.fx graph through ``torch.export``, for what fx cannot trace.

``torch.export`` runs the model's Python once on fake tensors (non-strict), so code that
``symbolic_trace`` refuses (``len()`` of a shape, ``np.array(x.shape)``, a dict indexed
by ``x.ndim``) simply runs. The graph is then at the level of ATen operators, with the
parameters and buffers as ``get_attr`` nodes under the model's own names and every node
tagged with the modules it ran inside: what the rest of ``medsplit.cutting`` reads.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.export import Dim
from torch.utils import _pytree as pytree

from medsplit.errors import CutError


def export_graph(owned: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    """Export ``owned`` in its current training mode, batch size left free.

    ``owned`` is the caller's own copy: the graph shares its parameters and buffers.

    Raises:
        CutError: the model's forward fixes the batch size (a static cut could not
            serve a smaller last batch).
    """
    # A batch of 1 would be specialised by export (sizes 0 and 1 always are): export
    # at 2 so that the batch dimension stays symbolic.
    example = tuple(torch.cat([t, t]) if t.shape[0] == 1 else t for t in inputs)
    dynamic = tuple({0: Dim.AUTO} for _ in example)
    program = torch.export.export(owned, example, dynamic_shapes=dynamic, strict=False)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    user_inputs = placeholders[len(placeholders) - len(example) :]
    for node in user_inputs:
        size = node.meta["val"].shape[0]
        if not isinstance(size, torch.SymInt):
            raise CutError(
                f"{type(owned).__name__}'s forward fixes the batch size to {size} "
                "(a size read from the input and used as a constant): segments must run "
                "on batches of any size"
            )
    return _plain(program.module(check_guards=False))


def _plain(unlifted: fx.GraphModule) -> fx.GraphModule:
    """The same graph with positional inputs and the output's own structure, without the
    pytree flattening ``torch.export`` wraps around it or its guard checks."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out_spec = unlifted._out_spec
    for node in unlifted.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            continue
        if node.op == "output":
            leaves = [env[n] if isinstance(n, fx.Node) else n for n in node.args[0]]
            graph.output(pytree.tree_unflatten(leaves, out_spec))
            continue
        copy = graph.node_copy(node, env.__getitem__)
        copy.meta = dict(node.meta)
        env[node] = copy
    graph.eliminate_dead_code(is_impure_node=_keeps)
    graph.lint()
    gm = fx.GraphModule(unlifted, graph, class_name=type(unlifted).__name__)
    return gm


def _keeps(node: fx.Node) -> bool:
    """Keep every node but unused shape reads and weights (the guards' inputs, a buffer
    only training mode updates): in-place updates of buffers have no users either."""
    if node.op == "get_attr":
        return False
    return not (node.op == "call_function" and node.target is torch.ops.aten.sym_size.int)
