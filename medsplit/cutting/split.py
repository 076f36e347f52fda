"""Cut a model into segments that, run one after another, compute exactly what it computes."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from medsplit.cutting.check import check_split
from medsplit.cutting.plan import (
    BoundaryTensor,
    SplitPlan,
    boundary_of,
    check_modes_agree,
    plan_split,
)
from medsplit.cutting.profile import as_example_inputs, profile_graph
from medsplit.cutting.recompute import is_shape_read, read_kind, shape_read
from medsplit.cutting.segment import Segment
from medsplit.cutting.trace import Traced, trace_modes
from medsplit.errors import CutError

#: What the segments are called, by their number: the names say where a segment sits in
#: the model, not who runs it (that is the mode's ``segments()``).
SEGMENT_NAMES = {2: ("front", "tail"), 3: ("front", "middle", "head")}


@dataclass(frozen=True)
class SplitModel:
    """The segments of a cut model.

    Every segment but the first takes the tensors crossing its cut as keyword
    arguments; every segment but the last returns them as a ``dict``. Parameter and
    buffer names are those of the original model, so ``{**front.state_dict(),
    **tail.state_dict()}`` loads into the original and back.

    Attributes:
        segments: ``(front, tail)`` for one cut, ``(front, middle, head)`` for two.
        cuts: the submodule names cut after, in order.
        boundaries: for each cut, the crossing tensors described per sample.
    """

    segments: tuple[Segment, ...]
    cuts: tuple[str, ...]
    boundaries: tuple[tuple[BoundaryTensor, ...], ...]

    @property
    def front(self) -> Segment:
        return self.segments[0]

    @property
    def tail(self) -> Segment:
        """The last segment, the one that ends in the model's output: the server's with
        one cut (vanilla), the hospital's head with two (U-shaped)."""
        return self.segments[-1]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Run all segments in turn (useful for evaluation and checks)."""
        out = self.segments[0](*inputs)
        for segment in self.segments[1:]:
            out = segment(**out)
        return out


def split_model(
    model: torch.nn.Module,
    example_input: torch.Tensor | Sequence[torch.Tensor],
    cuts: str | Sequence[str],
    *,
    tracer: str | None = None,
) -> SplitModel:
    """Cut ``model`` after each named submodule; the model itself is left untouched.

    Args:
        model: any module ``torch.fx`` can trace, or ``torch.export`` can export at
            ``example_input`` (MONAI's ViT, SwinUNETR, EfficientNet, ...).
        example_input: a batch-first input (or tuple of inputs) of the shape training uses.
        cuts: one submodule name (two segments), or two (three: front, middle, head).
        tracer: ``"torch.fx"`` or ``"torch.export"`` to use only that one (by default
            fx, and export where fx fails).

    Returns:
        The segments, their crossing tensors, and the cut names.

    Raises:
        CutError: the model cannot be traced or cut there, or the segments would not
            compute what the model computes in training or in evaluation mode; the
            message says why.

    Note:
        Each segment holds a graph traced in training mode and one traced in evaluation
        mode (:class:`~medsplit.cutting.segment.Segment`), so ``self.training`` reads,
        dropout, drop-connect and batch-norm statistics behave as in the model, and
        :func:`~medsplit.cutting.check.check_split` compares the split with the model in
        both modes, on the same random stream, before it is returned.
    """
    if not isinstance(model, torch.nn.Module):
        raise CutError(f"expected a torch.nn.Module to cut, got {type(model).__name__}")
    requested = (cuts,) if isinstance(cuts, str) else tuple(cuts)
    if len(requested) + 1 not in SEGMENT_NAMES:
        raise CutError(
            f"give one cut (two segments) or two cuts (three segments), got {len(requested)}"
        )
    inputs = as_example_inputs(example_input)
    model_name = type(model).__name__
    names = tuple(canonical_name(model, name) for name in requested)

    traced = trace_modes(model, inputs, tracer=tracer)
    batch = inputs[0].shape[0]
    train, evaluation = traced.graphs[True], traced.graphs[False]
    # Only shapes: cutting needs no FLOPs (the cut table counts its own), and counting
    # them runs a dispatch mode whose first use imports torch._dynamo (sympy and all,
    # about 70 MiB resident in every process that splits a model, and seconds).
    profiles = {True: profile_graph(train, inputs, flops=False)}
    plans = {
        True: plan_split(train, names, profiles[True], model_name=model_name, batch_size=batch)
    }
    if evaluation is train:
        profiles[False], plans[False] = profiles[True], plans[True]
    else:
        profiles[False] = profile_graph(evaluation, inputs, flops=False)
        plans[False] = plan_split(
            evaluation, names, profiles[False], model_name=model_name, batch_size=batch
        )
        check_modes_agree(plans, profiles)
    segments = build_segments(traced, plans, class_prefix=model_name)
    for segment in segments:
        # Which graph a segment runs follows its own flag: the model's, to begin with.
        segment.training = model.training
    boundaries = tuple(boundary_of(plans[True], i, profiles[True]) for i in range(len(names)))
    split = SplitModel(segments=segments, cuts=requested, boundaries=boundaries)
    check_split(traced.owned, split, inputs)
    return split


def canonical_name(model: torch.nn.Module, name: str) -> str:
    """The name torch.fx records for submodule ``name`` (its first name, for an alias).

    Raises:
        CutError: ``name`` is not a submodule of ``model``.
    """
    first_names = {id(m): n for n, m in model.named_modules() if n}
    try:
        module = model.get_submodule(name) if isinstance(name, str) and name else None
    except AttributeError:
        module = None
    if module is None or id(module) not in first_names:
        raise CutError(f"{name!r} is not a submodule of {type(model).__name__}")
    return first_names[id(module)]


def build_segments(
    traced: Traced, plans: dict[bool, SplitPlan], *, class_prefix: str
) -> tuple[Segment, ...]:
    """Build the segments of ``plans`` (one per training mode); they share the traced
    copy's parameters and buffers. Crossing tensors take the training plan's names."""
    wire_names = plans[True].wire_names
    labels = SEGMENT_NAMES[plans[True].num_segments]
    segments = []
    for seg in range(plans[True].num_segments):
        graphs = {True: _segment_graph(traced.graphs[True], plans[True], seg, wire_names)}
        same = traced.graphs[False] is traced.graphs[True]
        graphs[False] = (
            graphs[True]
            if same
            else _segment_graph(traced.graphs[False], plans[False], seg, wire_names)
        )
        name = f"{class_prefix}{labels[seg].capitalize()}"
        segments.append(Segment(traced.graphs, graphs, class_name=name))
    # What no graph reads still belongs in a checkpoint; a tied weight's second name
    # does not (its tensor is held already).
    held = {id(t) for segment in segments for t in segment.state_dict(keep_vars=True).values()}
    state = traced.owned.state_dict(keep_vars=True)
    segments[-1].adopt(traced.owned, [k for k, t in state.items() if id(t) not in held])
    return tuple(segments)


def _segment_graph(
    gm: fx.GraphModule, plan: SplitPlan, seg: int, wire_names: tuple[tuple[str, ...], ...]
) -> fx.Graph:
    nodes = list(gm.graph.nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    if seg > 0:
        incoming = zip(plan.crossings[seg - 1], wire_names[seg - 1], strict=True)
        for node, name in incoming:
            env[node] = graph.placeholder(name)
    for node in plan.recomputed[seg] if plan.recomputed else ():
        _recompute(graph, env, node, plan, reference=env[plan.crossings[seg - 1][0]])
    for node in nodes:
        if plan.partition[node] != seg or node.op == "output":
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    if seg < plan.num_segments - 1:
        outgoing = zip(plan.crossings[seg], wire_names[seg], strict=True)
        graph.output({name: env[node] for node, name in outgoing})
    else:
        graph.node_copy(nodes[-1], env.__getitem__)
    _copy_inputs_changed_in_place(graph, gm)
    for node in graph.nodes:
        # Fake tensors of an export would only weigh on every copy of the segment.
        node.meta = {k: v for k, v in node.meta.items() if k in _KEPT_META}
    graph.lint()
    return graph


_KEPT_META = ("nn_module_stack", "stack_trace")


def _recompute(
    graph: fx.Graph,
    env: dict[fx.Node, fx.Node],
    node: fx.Node,
    plan: SplitPlan,
    *,
    reference: fx.Node,
) -> fx.Node:
    """Compute ``node``, a number read from shapes, again in this segment."""
    if node in env:
        return env[node]
    if is_shape_read(node):
        assert plan.read_shapes is not None  # plan_split filled it for every such read
        shape, batch_first = plan.read_shapes[node]
        what, dim = read_kind(node)
        env[node] = graph.call_function(shape_read, (reference, shape, batch_first, what, dim))
        return env[node]
    for parent in node.all_input_nodes:
        _recompute(graph, env, parent, plan, reference=reference)
    env[node] = graph.node_copy(node, env.__getitem__)
    return env[node]


_IN_PLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.imatmul,
}  # fmt: skip


def _changes_in_place(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node`` writes into its first input (``ReLU(inplace=True)``, ``x.add_()``,
    ``x += y``, ``F.relu(x, inplace=True)``, ``aten.relu_``)."""
    if isinstance(node.target, torch._ops.OpOverload):
        arguments = node.target._schema.arguments
        alias = arguments[0].alias_info if arguments else None
        return alias is not None and alias.is_write
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.endswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        in_place_name = name.endswith("_") and not name.endswith("__")
        return (
            node.kwargs.get("inplace") is True
            or in_place_name
            or (node.target in _IN_PLACE_OPERATORS)
        )
    return False


def _copy_inputs_changed_in_place(graph: fx.Graph, gm: fx.GraphModule) -> None:
    """Give a segment's input that the segment changes in place a copy to change.

    The side that runs a segment feeds it tensors received over the wire as autograd
    leaves (to send their gradients back), and autograd refuses an in-place operation on
    a leaf that requires grad: DenseNet121's head, cut after ``features.norm5``, begins
    with ``ReLU(inplace=True)``. Every use then reads the copy, as every use in the whole
    model read the tensor the operation changed; a clone's gradient is the identity, so
    training stays exact.
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for placeholder in placeholders:
        if not any(
            _changes_in_place(user, gm) and user.args[:1] == (placeholder,)
            for user in placeholder.users
        ):
            continue
        with graph.inserting_after(placeholders[-1]):
            copy = graph.call_method("clone", (placeholder,))
        placeholder.replace_all_uses_with(copy, delete_user_cb=lambda user, c=copy: user is not c)
