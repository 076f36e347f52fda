"""An independent count of the tensors crossing a cut, from one eager forward pass.

Forward hooks mark where the cut module ends; a dispatch mode records, per tensor, the
operator that made it and the last one that read it. A tensor made before the cut and
read after it (or returned by the model) crosses. Nothing of ``medsplit.cutting`` is
used: no trace, no graph.
"""

from __future__ import annotations

import copy

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _Flow(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.made: dict[int, int] = {}
        self.last_read: dict[int, int] = {}
        self.tensors: dict[int, torch.Tensor] = {}  # keeps every tensor alive: ids stay unique

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self.last_read[id(t)] = self.ops
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in self.made:
                self.made[id(t)] = self.ops
                self.tensors[id(t)] = t
        self.ops += 1
        return out


def crossing_shapes(
    model: torch.nn.Module, x: torch.Tensor, cut: str, *, seed: int = 0
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Per-sample shapes and dtypes of the tensors crossing the cut after ``cut``, sorted,
    counted on a copy of ``model`` in its current mode (with the random stream seeded)."""
    model = copy.deepcopy(model)  # batch norm in training mode updates its statistics
    module = model.get_submodule(cut)
    flow = _Flow()
    ends: list[int] = []
    hook = module.register_forward_hook(lambda *_: ends.append(flow.ops))
    state = {id(t) for t in [*model.parameters(), *model.buffers()]}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), flow:
            torch.manual_seed(seed)
            out = model(x)
    finally:
        hook.remove()
    at = ends[-1]
    returned = {id(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)}
    crossing = []
    for key, made in flow.made.items():
        if key in state or made >= at:
            continue
        if flow.last_read.get(key, -1) >= at or key in returned:
            t = flow.tensors[key]
            crossing.append((tuple(t.shape[1:]), t.dtype))
    return sorted(crossing, key=repr)
