"""Cut a model into segments that, run one after another, compute exactly what it computes."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from medsplit.cutting.plan import BoundaryTensor, SplitPlan, boundary_of, plan_split
from medsplit.cutting.profile import as_example_inputs, profile_graph
from medsplit.cutting.trace import trace
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

    segments: tuple[fx.GraphModule, ...]
    cuts: tuple[str, ...]
    boundaries: tuple[tuple[BoundaryTensor, ...], ...]

    @property
    def front(self) -> fx.GraphModule:
        return self.segments[0]

    @property
    def tail(self) -> fx.GraphModule:
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
) -> SplitModel:
    """Cut ``model`` after each named submodule; the model itself is left untouched.

    Args:
        model: any module ``torch.fx`` can trace (``nn.Sequential``, MONAI networks, ...).
        example_input: a batch-first input (or tuple of inputs) of the shape training uses.
        cuts: one submodule name (two segments), or two (three: front, middle, head).

    Returns:
        The segments, their crossing tensors, and the cut names.

    Raises:
        CutError: the model cannot be traced or cut there; the message says why.

    Note:
        Like any ``torch.fx`` trace, Python code in ``forward`` runs once, at cut time:
        a read of ``self.training`` there (``F.dropout(x, p, self.training)``) is frozen
        into the segments. Use modules (``nn.Dropout``) for train/eval differences.
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

    gm = trace(model)
    profiles = profile_graph(gm, inputs)
    plan = plan_split(gm, names, profiles, model_name=model_name, batch_size=inputs[0].shape[0])
    segments = build_segments(gm, plan, class_prefix=model_name)
    boundaries = tuple(boundary_of(plan, i, profiles) for i in range(len(names)))
    split = SplitModel(segments=segments, cuts=requested, boundaries=boundaries)
    _check_reproduces(gm, split, inputs)
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
    gm: fx.GraphModule, plan: SplitPlan, *, class_prefix: str
) -> tuple[fx.GraphModule, ...]:
    """Build one GraphModule per segment of ``plan``; they share modules with ``gm``."""
    nodes = list(gm.graph.nodes)
    labels = SEGMENT_NAMES[plan.num_segments]
    segments = []
    for seg in range(plan.num_segments):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        lookup = env.__getitem__
        if seg > 0:
            incoming = zip(plan.crossings[seg - 1], plan.wire_names[seg - 1], strict=True)
            for node, name in incoming:
                env[node] = graph.placeholder(name)
        for node in nodes:
            if plan.partition[node] != seg or node.op == "output":
                continue
            env[node] = graph.node_copy(node, lookup)
        if seg < plan.num_segments - 1:
            outgoing = zip(plan.crossings[seg], plan.wire_names[seg], strict=True)
            graph.output({name: env[node] for node, name in outgoing})
        else:
            graph.node_copy(nodes[-1], lookup)
        _copy_inputs_changed_in_place(graph, gm)
        graph.lint()
        name = f"{class_prefix}{labels[seg].capitalize()}"
        segments.append(fx.GraphModule(gm, graph, class_name=name))
    return tuple(segments)


_IN_PLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.imatmul,
}  # fmt: skip


def _changes_in_place(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node`` writes into its first input (``ReLU(inplace=True)``, ``x.add_()``,
    ``x += y``, ``F.relu(x, inplace=True)``)."""
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


def _check_reproduces(
    gm: fx.GraphModule, split: SplitModel, inputs: tuple[torch.Tensor, ...]
) -> None:
    """Refuse a split whose segments do not compute what the whole model computes."""
    flags = {m: m.training for m in gm.modules()}
    gm.eval()
    try:
        with torch.no_grad():
            whole = gm(*inputs)
            parts = split.forward(*inputs)
    finally:
        for module, flag in flags.items():
            module.training = flag
    if not _same(whole, parts):
        raise CutError(
            f"the segments cut at {list(split.cuts)} do not reproduce the model's output; "
            "the model may draw random numbers or keep hidden state in forward"
        )


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b
