"""The cut table: what each candidate cut costs a hospital and sends over the wire."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import fx

from medsplit.cutting.candidates import choose
from medsplit.cutting.plan import BoundaryTensor, boundary_of, check_modes_agree, plan_split
from medsplit.cutting.profile import NodeProfile, as_example_inputs, profile_graph
from medsplit.cutting.trace import trace, trace_modes
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


class CutRows(list[CutInfo]):
    """The rows of a cut table, a list, with ``note`` saying where a default table
    stopped short, or why it is empty (``None`` otherwise)."""

    note: str | None = None


def candidate_cuts(model: torch.nn.Module, *, depth: int | None = None) -> list[str]:
    """Submodule names to cut after, in forward order, one per cut position: every
    module at most ``depth`` deep, or by default as deep as the crossings change
    (:mod:`medsplit.cutting.candidates`).

    ``model`` may be a module (traced with ``torch.fx``) or its trace.
    """
    gm = model if isinstance(model, fx.GraphModule) else trace(model)
    return choose(gm, depth=depth).names


def cut_table(
    model: torch.nn.Module,
    example_input: torch.Tensor | Sequence[torch.Tensor],
    *,
    candidates: Sequence[str] | None = None,
    depth: int | None = None,
    tracer: str | None = None,
) -> CutRows:
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
        candidates: names to price; by default, the module boundaries down to where
            the set of crossing tensors changes, at most ``MAX_ROWS`` of them (the
            rows' ``note`` says when the table stops short).
        depth: instead, every submodule at most this many names deep (1 to
            ``MAX_DEPTH``).
        tracer: ``"torch.fx"`` or ``"torch.export"`` to use only that one.

    Returns:
        One ``CutInfo`` per valid cut, in forward order.

    Raises:
        CutError: the model cannot be traced, a named candidate cannot be cut, or
            ``depth`` is out of range.
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
    note = None
    if candidates is not None:
        names = list(candidates)
    else:
        chosen = choose(gm, depth=depth, sent=lambda n: _is_tensor(profiles.get(n)))
        names, note = chosen.names, chosen.note
    total_params = sum(p.numel() for p in gm.parameters())
    params = dict(gm.named_parameters())
    nodes = list(gm.graph.nodes)
    model_name = type(model).__name__
    rows = CutRows()
    rows.note = note
    refusals: dict[str, str] = {}
    for name in names:
        try:
            plan = plan_split(gm, (name,), profiles, model_name=model_name, batch_size=batch)
            if evaluation is not None:
                graph, shapes = evaluation
                other = plan_split(graph, (name,), shapes, model_name=model_name, batch_size=batch)
                check_modes_agree({True: plan, False: other}, {True: profiles, False: shapes})
        except CutError as e:
            if candidates is not None:
                raise
            refusals.setdefault(name, str(e))
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
    if not rows and candidates is None:
        # An empty table would read as "nothing to choose", not "why".
        first = next(iter(refusals.items()), None)
        why = f"; {first[0]!r}: {first[1]}" if first else ""
        rows.note = (
            f"no cut of the {len(names)} looked at is valid at this shape "
            f"({len(refusals)} refused, the others leave one side without weights){why}"
        )
    return rows


def _is_tensor(profile: NodeProfile | None) -> bool:
    return profile is not None and profile.shape is not None


def _front_flops(
    nodes: list[fx.Node], partition: dict[fx.Node, int], profiles: dict[fx.Node, NodeProfile]
) -> int:
    return sum(profiles[n].flops for n in nodes if partition[n] == 0 and n in profiles)
