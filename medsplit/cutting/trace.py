"""Trace a model into torch.fx graphs, one per training mode, and read facts off their nodes.

``torch.fx.symbolic_trace`` is tried first: its graph calls the model's own layers, so
it reads like the model. What it cannot trace (``len()`` of a shape, a NumPy array made
from a shape, einops' patterns) goes through ``torch.export`` instead
(:mod:`medsplit.cutting.export`), whose graph is made of ATen operators over the same
parameters, under the same names.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import fx

from medsplit.cutting.diagnose import Stop, diagnose
from medsplit.cutting.export import export_graph
from medsplit.errors import CutError

FX = "torch.fx"
EXPORT = "torch.export"


@dataclass(frozen=True)
class Traced:
    """A model's graphs, by training flag, over one copy of its parameters.

    Attributes:
        graphs: ``{True: traced in training mode, False: traced in evaluation mode}``;
            both read the same parameter and buffer objects.
        tracer: ``"torch.fx"`` or ``"torch.export"``.
        owned: the copy of the model whose parameters and buffers the graphs read.
        fx_stop: why ``symbolic_trace`` was not used (``None`` when it was).

    Where the forward pass reads ``self.training`` nowhere outside leaf modules, fx
    gives the same graph in both modes, and ``graphs`` holds that one graph twice.
    """

    graphs: dict[bool, fx.GraphModule]
    tracer: str
    owned: torch.nn.Module
    fx_stop: Stop | None = None

    @property
    def train(self) -> fx.GraphModule:
        """The graph traced in training mode: the one the cut table describes."""
        return self.graphs[True]


def trace_modes(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], *, tracer: str | None = None
) -> Traced:
    """Trace a deep copy of ``model`` in training and in evaluation mode.

    Args:
        model: the model; it is never modified.
        inputs: a batch-first example (``torch.export`` needs one).
        tracer: ``"torch.fx"`` or ``"torch.export"`` to use only that one; by default
            fx, and export where fx fails.

    Raises:
        CutError: neither tracer can follow the forward pass; the message names the
            module and line where each stopped, and the kind of construct.
    """
    owned = _own(model)
    fx_stop = None
    # Tracing sets each mode in turn; the segments start in the model's own flags.
    flags = {name: m.training for name, m in model.named_modules()}
    if tracer in (None, FX):
        try:
            graphs = {mode: _symbolic(owned, mode) for mode in (True, False)}
            if graphs[True].code == graphs[False].code:
                graphs[False] = graphs[True]
            return Traced(graphs, FX, _flagged(owned, flags))
        except Exception as e:  # fx raises plain errors for many unsupported constructs
            fx_stop = diagnose(e, owned)
            # Export would stop at the same branch, only later.
            if tracer == FX or fx_stop.data_dependent:
                raise CutError(_cannot(model, [(FX, fx_stop)])) from e
    owned = _own(model)  # fx may have left attributes behind on a failed trace
    try:
        graphs = {mode: _exported(owned, inputs, mode) for mode in (True, False)}
    except CutError:
        raise
    except Exception as e:  # export's own errors come in many classes
        _check_runs(model, inputs)
        stops = [(FX, fx_stop)] if fx_stop is not None else []
        raise CutError(_cannot(model, [*stops, (EXPORT, diagnose(e, owned))])) from e
    return Traced(graphs, EXPORT, _flagged(owned, flags), fx_stop)


def _check_runs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Refuse, saying so, a model that does not run at this input even untraced (an
    image too small for it): no tracer is to blame then."""
    for training in (True, False):
        trial = _own(model).train(training)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                trial(*inputs)
        except Exception as e:  # the model's own checks raise anything
            shapes = ", ".join(str(list(t.shape)) for t in inputs)
            mode = "training" if training else "evaluation"
            stop = diagnose(e, trial)
            raise CutError(
                f"{type(model).__name__} does not run on an input of shape {shapes} in "
                f"{mode} mode, untraced: {stop.detail} ({stop.where()}). Try a larger input."
            ) from e


def _flagged(owned: torch.nn.Module, flags: dict[str, bool]) -> torch.nn.Module:
    for name, module in owned.named_modules():
        module.training = flags[name]
    return owned


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """Symbolically trace a deep copy of ``model`` as it is (no example needed).

    Raises:
        CutError: ``torch.fx`` cannot trace it (the message says where and why).
    """
    owned = _own(model)
    try:
        return fx.symbolic_trace(owned)
    except Exception as e:  # fx raises plain errors for many unsupported constructs
        raise CutError(_cannot(model, [(FX, diagnose(e, owned))])) from e


def _own(model: torch.nn.Module) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise CutError(f"expected a torch.nn.Module to cut, got {type(model).__name__}")
    return copy.deepcopy(model)


def _symbolic(owned: torch.nn.Module, training: bool) -> fx.GraphModule:
    owned.train(training)
    return fx.symbolic_trace(owned)


def _exported(
    owned: torch.nn.Module, inputs: tuple[torch.Tensor, ...], training: bool
) -> fx.GraphModule:
    owned.train(training)
    # Export runs forward on fake tensors; the random stream it would draw from is the
    # caller's, so keep it as it was.
    with torch.random.fork_rng(devices=[]):
        return export_graph(owned, inputs)


def _cannot(model: torch.nn.Module, stops: list[tuple[str, Stop]]) -> str:
    """Why ``model`` cannot be cut, tracer by tracer, with advice that applies."""
    name = type(model).__name__
    parts = [f"{tracer} stopped {stop.describe()}" for tracer, stop in stops]
    last = stops[-1][1]
    if last.data_dependent:
        advice = (
            "A branch, loop or size that depends on tensor values cannot be followed by "
            "any fixed cut: compute both sides with torch.where, or make it depend on "
            "shapes or attributes."
        )
    elif len(stops) == 1 and stops[0][0] == FX:
        advice = "Give an example input so that torch.export can be tried."
    else:
        advice = (
            "Rewrite that statement with torch operations on tensors and Python numbers "
            "read from shapes, or wrap the module so that its forward takes only tensors."
        )
    return f"{name} cannot be cut: " + "; ".join(parts) + ". " + advice


def module_path_stack(node: fx.Node) -> list[str]:
    """Qualified names of the modules this node was traced inside, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [value[0] if isinstance(value, tuple) else key for key, value in stack.items()]
    if node.op == "call_module" and node.target not in paths:
        paths.append(str(node.target))
    return paths


# What each node reads, kept on the traced graph's module, so that it goes with it: a cut
# table plans every candidate on one graph. (A module-level WeakKeyDictionary kept every
# traced model alive for the process's life: its values hold the nodes, which hold the
# module, and the parameters with it, 30 MB a DenseNet121 split.)
_STATE_ATTRIBUTE = "_medsplit_owned_state"


def owned_state(root: torch.nn.Module, node: fx.Node) -> dict[str, torch.Tensor]:
    """Parameters and buffers a node reads, by qualified name (empty for pure functions)."""
    known: dict[fx.Node, dict[str, torch.Tensor]] = root.__dict__.setdefault(_STATE_ATTRIBUTE, {})
    if node not in known:
        known[node] = _read_state(root, node)
    return known[node]


def _read_state(root: torch.nn.Module, node: fx.Node) -> dict[str, torch.Tensor]:
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
