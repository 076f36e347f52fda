"""Decide which graph nodes fall on which side of one or more cuts, and why a cut is refused."""

from __future__ import annotations

import bisect
import keyword
from dataclasses import dataclass

import torch
from torch import fx

from medsplit.cutting.profile import NodeProfile
from medsplit.cutting.recompute import is_shape_read, number_slice
from medsplit.cutting.trace import module_path_stack, owned_state
from medsplit.errors import CutError

# Frames carry these beside the crossing tensors (see medsplit.protocol); a crossing
# tensor may not take their names.
RESERVED_TENSOR_NAMES = frozenset({"labels", "loss"})


@dataclass(frozen=True)
class BoundaryTensor:
    """One tensor that crosses a cut, described per sample (batch dimension removed)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        """Values per sample."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes per sample."""
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SplitPlan:
    """Where each node runs, and what crosses each cut.

    ``crossings[i]`` lists the nodes computed in segment ``i`` and used in segment
    ``i + 1``, in graph order, and ``wire_names[i]`` the names they cross under: a
    module's output is named after the module (``features_denseblock1``), any other
    tensor after the graph node that made it. ``state_names[i]`` holds the parameter and
    buffer names of segment ``i``.

    ``recomputed[i]`` lists the numbers read from shapes (``n = x.shape[0]``) that
    segment ``i`` uses but an earlier segment computed: segment ``i`` computes them again
    (:mod:`medsplit.cutting.recompute`), from ``read_shapes``: per shape read in their
    computation, the shape of the tensor read and whether its first dimension is the
    batch.
    """

    cuts: tuple[str, ...]
    positions: tuple[int, ...]
    partition: dict[fx.Node, int]
    crossings: tuple[tuple[fx.Node, ...], ...]
    wire_names: tuple[tuple[str, ...], ...]
    state_names: tuple[frozenset[str], ...]
    recomputed: tuple[tuple[fx.Node, ...], ...] = ()
    read_shapes: dict[fx.Node, tuple[tuple[int, ...], bool]] | None = None

    @property
    def num_segments(self) -> int:
        return len(self.cuts) + 1


def cut_position(gm: fx.GraphModule, name: str, *, model_name: str) -> int:
    """Index of the last graph node that runs inside submodule ``name``."""
    last = -1
    for index, node in enumerate(gm.graph.nodes):
        if name in module_path_stack(node):
            last = index
    if last < 0:
        raise CutError(
            f"{name!r} is not a submodule that runs in the forward pass of {model_name}; "
            "a cut is named by a submodule's qualified name, e.g. 'features.denseblock1' "
            "(see `medsplit cuts MODEL` for the candidates)"
        )
    return last


def plan_split(
    gm: fx.GraphModule,
    cuts: tuple[str, ...],
    profiles: dict[fx.Node, NodeProfile],
    *,
    model_name: str,
    batch_size: int,
) -> SplitPlan:
    """Partition the traced graph at ``cuts`` (after each named submodule).

    Raises:
        CutError: an unknown name, cuts out of order, the raw input or a non-tensor
            value crossing, a tensor skipping a segment, or weights used on both sides.
    """
    if not cuts:
        raise CutError("at least one cut is needed")
    nodes = list(gm.graph.nodes)
    positions = tuple(cut_position(gm, c, model_name=model_name) for c in cuts)
    for i in range(1, len(cuts)):
        if positions[i] <= positions[i - 1]:
            raise CutError(
                f"cut {cuts[i]!r} must come after cut {cuts[i - 1]!r} in the forward pass"
            )
    last = len(cuts)

    partition: dict[fx.Node, int] = {}
    for index, node in enumerate(nodes):
        if node.op == "placeholder":
            partition[node] = 0
        elif node.op == "output":
            partition[node] = last
        elif node.op != "get_attr":
            partition[node] = bisect.bisect_left(positions, index)
    for node in nodes:
        if node.op == "get_attr":
            users = [partition[u] for u in node.users]
            partition[node] = min(users, default=0)

    from_input, through_weights = _lineage(gm, nodes)
    crossings: list[list[fx.Node]] = [[] for _ in cuts]
    recomputed: list[dict[fx.Node, None]] = [{} for _ in range(last + 1)]
    read_shapes: dict[fx.Node, tuple[tuple[int, ...], bool]] = {}
    for node in nodes:
        if node.op == "output":
            continue
        here = partition[node]
        later = sorted({partition[u] for u in node.users if partition[u] > here})
        if not later:
            continue
        where = f"cut {cuts[here]!r}"
        if node.op == "placeholder":
            raise CutError(
                f"the model input {node.name!r} is used after {where}: raw data would leave "
                "the hospital. Cut later, after every layer that reads the input."
            )
        if node.op == "get_attr":
            raise CutError(
                f"weight {node.target!r} is used on both sides of {where}; "
                "shared weights cannot be split"
            )
        profile = profiles.get(node)
        if profile is None or profile.shape is None:
            reads = _shape_reads(node, profiles, batch_size, from_input)
            if reads is None:
                raise CutError(
                    f"value {node.name!r}{source_of(node)} crossing {where} is not a tensor, "
                    "nor a number computed from shapes; only tensors can be sent. Cut before "
                    "or after the code that computes it."
                )
            read_shapes.update(reads)
            for seg in later:
                recomputed[seg][node] = None
            continue
        if later != [here + 1]:
            raise CutError(
                f"tensor {node.name!r} from segment {here} is used in segment {later[-1]}, "
                f"skipping segment {here + 1}; choose cuts so that every skip connection "
                "lands in the next segment"
            )
        if not profile.shape or profile.shape[0] != batch_size:
            raise CutError(
                f"tensor {node.name!r} crossing {where} has shape {list(profile.shape)}, "
                f"which is not batch-first for the example batch of {batch_size}"
            )
        if from_input[node] and not through_weights[node]:
            raise CutError(
                f"tensor {node.name!r} crossing {where} is computed from the model input "
                "without passing through any layer with weights: raw data would leave the "
                "hospital. Cut after a layer with weights that every such path goes through."
            )
        crossings[here].append(node)
    ends = _module_ends(nodes)
    wire_names = tuple(_wire_names(crossings[i], cuts[i], ends) for i in range(len(cuts)))

    # Owners are keyed by tensor identity: a tied weight answers to two names.
    owners: dict[int, tuple[int, str]] = {}
    state: list[set[str]] = [set() for _ in range(last + 1)]
    for node in nodes:
        seg = partition[node]
        for name, tensor in owned_state(gm, node).items():
            first_seg, first_name = owners.setdefault(id(tensor), (seg, name))
            if first_seg != seg:
                also = "" if first_name == name else f" (also known as {first_name!r})"
                raise CutError(
                    f"weight {name!r}{also} is used on both sides of cut "
                    f"{cuts[min(seg, first_seg)]!r}; shared weights cannot be split"
                )
            state[seg].add(name)

    return SplitPlan(
        cuts=cuts,
        positions=positions,
        partition=partition,
        crossings=tuple(tuple(c) for c in crossings),
        wire_names=wire_names,
        state_names=tuple(frozenset(s) for s in state),
        recomputed=tuple(tuple(r) for r in recomputed),
        read_shapes=read_shapes,
    )


def _shape_reads(
    node: fx.Node,
    profiles: dict[fx.Node, NodeProfile],
    batch_size: int,
    from_input: dict[fx.Node, bool],
) -> dict[fx.Node, tuple[tuple[int, ...], bool]] | None:
    """For a number computed from shapes, each shape read's tensor shape and whether its
    first dimension is the batch (the tensor comes from the input, batch first)."""
    nodes = number_slice(node)
    if nodes is None:
        return None
    reads = {}
    for read in (n for n in nodes if is_shape_read(n)):
        tensor = read.args[0]
        profile = profiles.get(tensor) if isinstance(tensor, fx.Node) else None
        if profile is None or profile.shape is None:
            return None
        batch_first = bool(profile.shape) and profile.shape[0] == batch_size
        reads[read] = (profile.shape, batch_first and from_input[tensor])
    return reads


def source_of(node: fx.Node) -> str:
    """`` (from file.py:12, `n = x.shape[0]`)`` where the trace recorded it (an export
    does; fx, for speed, does not), else ``""``."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    lines = [line.strip() for line in str(trace).strip().splitlines()]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("File "):
            where = lines[index].split(",")
            file = where[0].removeprefix("File ").strip('"').rsplit("/", 1)[-1]
            line = where[1].strip().removeprefix("line ") if len(where) > 1 else "?"
            code = lines[index + 1] if index + 1 < len(lines) else ""
            return f" (from {file}:{line}, `{code}`)"
    return ""


def _lineage(
    gm: fx.GraphModule, nodes: list[fx.Node]
) -> tuple[dict[fx.Node, bool], dict[fx.Node, bool]]:
    """Per node: does it depend on the input, and does every input path cross a weight?

    ``through_weights[n]`` is true when ``n`` reads parameters itself or every input it
    depends on reaches it through some node that does; a value from the input with no
    weights on the way (a reshape, a pooling) is still the raw image.
    """
    from_input: dict[fx.Node, bool] = {}
    through: dict[fx.Node, bool] = {}
    for node in nodes:
        parents = node.all_input_nodes
        # A layer reads its weights itself (fx's call_module), or as get_attr inputs
        # (an exported graph's aten.conv2d).
        read = [node, *(p for p in parents if p.op == "get_attr")]
        has_weights = any(
            isinstance(t, torch.nn.Parameter) for n in read for t in owned_state(gm, n).values()
        )
        # A shape (the batch size a random mask is drawn at) carries no pixel.
        from_input[node] = node.op == "placeholder" or (
            not is_shape_read(node) and any(from_input[p] for p in parents)
        )
        through[node] = has_weights or all(through[p] for p in parents if from_input[p])
        if node.op == "placeholder":
            through[node] = False
    return from_input, through


def _module_ends(nodes: list[fx.Node]) -> dict[fx.Node, str]:
    """For each node that is the last one of a module, the outermost such module's name."""
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for path in module_path_stack(node):
            last[path] = index
    ends: dict[fx.Node, str] = {}
    for path, index in last.items():
        current = ends.get(nodes[index])
        if current is None or path.count(".") < current.count("."):
            ends[nodes[index]] = path
    return ends


def _wire_names(crossing: list[fx.Node], cut: str, ends: dict[fx.Node, str]) -> tuple[str, ...]:
    """Name each crossing tensor after the module whose output it is, else after its node."""
    names = []
    for node in crossing:
        name = node.name
        module = ends.get(node)
        if module is not None:
            candidate = module.replace(".", "_")
            # Segments take crossing tensors as keyword arguments: names must be identifiers.
            if candidate.isidentifier() and not keyword.iskeyword(candidate):
                name = candidate
        if name in RESERVED_TENSOR_NAMES:
            raise CutError(
                f"tensor {name!r} crossing cut {cut!r} has a name frames reserve; "
                "rename the submodule that produces it"
            )
        names.append(name)
    if len(set(names)) != len(names):
        names = [node.name for node in crossing]
    return tuple(names)


def boundary_of(
    plan: SplitPlan, cut_index: int, profiles: dict[fx.Node, NodeProfile]
) -> tuple[BoundaryTensor, ...]:
    """Per-sample description of the tensors crossing one cut."""
    out = []
    crossing = plan.crossings[cut_index]
    for node, name in zip(crossing, plan.wire_names[cut_index], strict=True):
        p = profiles[node]
        assert p.shape is not None and p.dtype is not None  # plan_split checked it
        out.append(BoundaryTensor(name, p.shape[1:], p.dtype))
    return tuple(out)


def check_modes_agree(
    plans: dict[bool, SplitPlan], profiles: dict[bool, dict[fx.Node, NodeProfile]]
) -> None:
    """Refuse cuts where training and evaluation mode would send different tensors, or
    keep a weight on different sides."""
    train, evaluation = plans[True], plans[False]
    for i, cut in enumerate(train.cuts):
        sent = {
            mode: [(profiles[mode][n].shape, profiles[mode][n].dtype) for n in p.crossings[i]]
            for mode, p in plans.items()
        }
        if sent[True] != sent[False]:
            raise CutError(
                f"different tensors cross cut {cut!r} in training mode "
                f"({len(sent[True])}: {', '.join(train.wire_names[i])}) and in evaluation "
                f"mode ({len(sent[False])}: {', '.join(evaluation.wire_names[i])}): a "
                "`self.training` branch spans the cut; cut before or after it"
            )
    for seg, names in enumerate(evaluation.state_names):
        moved = sorted(names - train.state_names[seg])
        if moved:
            raise CutError(
                f"weight {moved[0]!r} is used in segment {seg} in evaluation mode but not in "
                "training mode: a `self.training` branch spans the cut; cut before or after it"
            )
