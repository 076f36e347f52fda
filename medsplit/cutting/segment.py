"""One segment of a cut model: a module that runs its training-mode or its eval-mode graph."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx


class Segment(torch.nn.Module):
    """The layers of one segment, under the model's own names, and two graphs over them.

    A trace freezes Python that reads ``self.training`` (``F.dropout(x, p,
    self.training)``, MONAI's drop-connect), and an exported graph freezes every
    module's mode. A segment therefore keeps the graph traced in training mode and the
    one traced in evaluation mode, and runs the one that matches its own
    ``training`` flag, as the model would.

    Attributes:
        graphs: ``{True: training graph, False: evaluation graph}``; one graph twice
            where the two traces are the same.
    """

    def __init__(
        self,
        roots: dict[bool, torch.nn.Module],
        graphs: dict[bool, fx.Graph],
        *,
        class_name: str,
    ) -> None:
        super().__init__()
        for mode, graph in graphs.items():
            for node in graph.nodes:
                if node.op in ("get_attr", "call_module"):
                    _install(roots[mode], self, node)
        self.class_name = class_name
        self.graphs = graphs
        # GraphModule writes the code; it reads every attribute through ``self``, so the
        # code runs on this module's own attributes (those ``.to()`` moves).
        compiled: dict[int, Callable[..., object]] = {}
        for graph in graphs.values():
            if id(graph) not in compiled:
                code = fx.GraphModule(self, graph, class_name=class_name)
                compiled[id(graph)] = type(code).forward
        self._forwards = {mode: compiled[id(graph)] for mode, graph in graphs.items()}

    def adopt(self, root: torch.nn.Module, names: list[str]) -> None:
        """Hold parameters and buffers no graph reads (a layer the forward pass skips),
        so that the segments' state dicts together are the model's."""
        for name in names:
            _install(root, self, name)

    @property
    def graph(self) -> fx.Graph:
        """The training-mode graph."""
        return self.graphs[True]

    def forward(self, *args: object, **kwargs: object) -> object:
        return self._forwards[self.training](self, *args, **kwargs)

    def extra_repr(self) -> str:
        return self.class_name


def _install(root: torch.nn.Module, segment: torch.nn.Module, node: fx.Node | str) -> None:
    """Give ``segment`` what ``node`` (or a name) reads from ``root``, under the same name.

    Parameters, buffers and modules are shared with ``root`` (one object, two graphs).
    A constant an export made (``_tensor_constant0``) that names something else in the
    other mode's graph is installed under a name of its own.
    """
    target = node if isinstance(node, str) else str(node.target)
    value = _get(root, target)
    if _get(segment, target) is value:
        return
    *owner_path, own_field = target.split(".")
    owner = root.get_submodule(".".join(owner_path))
    persistent = own_field in owner._buffers and own_field not in owner._non_persistent_buffers_set
    if _get(segment, target) is not None and isinstance(node, fx.Node):
        target = f"{target.replace('.', '_')}_{len(segment._buffers)}"
        node.target = target
    *prefix, field = target.split(".")
    dst: torch.nn.Module = segment
    for atom in prefix:
        child = dst._modules.get(atom)
        if child is None:
            child = torch.nn.Module()
            dst.add_module(atom, child)
        dst = child
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        # A buffer stays in the state dict as in the model; a plain tensor attribute
        # (which an export lifts as a constant) moves with .to() but stays out of it.
        dst.register_buffer(field, value, persistent=persistent)
    else:
        setattr(dst, field, value)


def _get(module: torch.nn.Module, target: str) -> object:
    value: object = module
    for atom in target.split("."):
        value = getattr(value, atom, None)
        if value is None:
            return None
    return value
