"""The cut table: what each candidate cut costs a hospital and sends over the wire."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import fx

from medsplit.cutting.plan import (
    BoundaryTensor,
    boundary_of,
    check_modes_agree,
    cut_position,
    plan_split,
)
from medsplit.cutting.profile import NodeProfile, as_example_inputs, profile_graph
from medsplit.cutting.trace import module_path_stack, trace, trace_modes
from medsplit.errors import CutError


@dataclass(frozen=True)
class CutInfo:
    """One row of the cut table (all figures per sample where it says so).

    Attributes:
        name: the submodule the model is cut after.
        client_params: parameters on the hospital's side of the cut.
        client_param_share: ``client_params`` over all parameters, in [0, 1].
        client_flops_per_sample: forward FLOPs of the hospital's layers for one sample.
        crossing: the tensors crossing the cut.
        values_per_sample: values crossing the cut for one sample, all tensors together.
        bytes_per_sample: the same in bytes, before any codec.
    """

    name: str
    client_params: int
    client_param_share: float
    client_flops_per_sample: int
    crossing: tuple[BoundaryTensor, ...]
    values_per_sample: int
    bytes_per_sample: int

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (dtypes as strings, shapes as lists)."""
        row = asdict(self)
        row["crossing"] = [
            {"name": t.name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for t in self.crossing
        ]
        return row


def candidate_cuts(model: torch.nn.Module, *, max_depth: int = 2) -> list[str]:
    """Submodule names at most ``max_depth`` deep, in forward order, one per cut position.

    ``model`` may be a module or its ``torch.fx`` trace.
    """
    gm = model if isinstance(model, fx.GraphModule) else trace(model)
    seen: dict[str, int] = {}
    for node in gm.graph.nodes:
        for path in module_path_stack(node):
            if path and path.count(".") < max_depth and path not in seen:
                seen[path] = len(seen)
    by_position: dict[int, str] = {}
    for name in seen:
        position = cut_position(gm, name, model_name=type(gm).__name__)
        current = by_position.get(position)
        # Several names can end at one node; the shallowest names the cut most plainly.
        if current is None or name.count(".") < current.count("."):
            by_position[position] = name
    return [by_position[p] for p in sorted(by_position)]


def cut_table(
    model: torch.nn.Module,
    example_input: torch.Tensor | Sequence[torch.Tensor],
    *,
    candidates: Sequence[str] | None = None,
    max_depth: int = 2,
    tracer: str | None = None,
) -> list[CutInfo]:
    """Price every valid cut of ``model`` at the shape of ``example_input``.

    The model is traced as :func:`~medsplit.cutting.split.split_model` traces it
    (``torch.fx``, else ``torch.export``), and priced in training mode, the mode it is
    trained in; a cut is valid only where both modes send the same tensors.

    By default a candidate is kept when the cut is valid (see ``split_model``) and both
    sides hold parameters: a front without weights would send what is in effect the raw
    image, and a back without weights leaves the server nothing to train. Names given in
    ``candidates`` are all priced, and an invalid one raises ``CutError``.

    Args:
        model: the model to cut; it is not modified.
        example_input: a batch-first example; figures are divided by its batch size.
        candidates: names to price; by default, submodules up to ``max_depth`` deep.
        max_depth: how deep to look for candidate submodules.
        tracer: ``"torch.fx"`` or ``"torch.export"`` to use only that one.

    Returns:
        One ``CutInfo`` per valid cut, in forward order.
    """
    inputs = as_example_inputs(example_input)
    batch = inputs[0].shape[0]
    traced = trace_modes(model, inputs, tracer=tracer)
    gm = traced.train
    profiles = profile_graph(gm, inputs)
    evaluation = None
    if traced.graphs[False] is not gm:
        other = traced.graphs[False]
        evaluation = (other, profile_graph(other, inputs, flops=False))
    names = list(candidates) if candidates is not None else candidate_cuts(gm, max_depth=max_depth)
    total_params = sum(p.numel() for p in gm.parameters())
    params = dict(gm.named_parameters())
    nodes = list(gm.graph.nodes)
    model_name = type(model).__name__
    rows = []
    for name in names:
        try:
            plan = plan_split(gm, (name,), profiles, model_name=model_name, batch_size=batch)
            if evaluation is not None:
                graph, shapes = evaluation
                other = plan_split(graph, (name,), shapes, model_name=model_name, batch_size=batch)
                check_modes_agree({True: plan, False: other}, {True: profiles, False: shapes})
        except CutError:
            if candidates is not None:
                raise
            continue
        front_params = sum(params[n].numel() for n in plan.state_names[0] if n in params)
        back_params = sum(params[n].numel() for n in plan.state_names[1] if n in params)
        if candidates is None and (front_params == 0 or back_params == 0):
            continue
        crossing = boundary_of(plan, 0, profiles)
        rows.append(
            CutInfo(
                name=name,
                client_params=front_params,
                client_param_share=front_params / total_params if total_params else 0.0,
                client_flops_per_sample=_front_flops(nodes, plan.partition, profiles) // batch,
                crossing=crossing,
                values_per_sample=sum(t.numel for t in crossing),
                bytes_per_sample=sum(t.nbytes for t in crossing),
            )
        )
    return rows


def _front_flops(
    nodes: list[fx.Node], partition: dict[fx.Node, int], profiles: dict[fx.Node, NodeProfile]
) -> int:
    return sum(profiles[n].flops for n in nodes if partition[n] == 0 and n in profiles)
