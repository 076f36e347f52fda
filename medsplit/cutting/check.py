"""Check that a split computes what the model computes, in training and evaluation mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import fx

from medsplit.cutting.trace import module_path_stack
from medsplit.errors import CutError

#: Seed of the random stream both the model and the split draw from in the check.
CHECK_SEED = 0


def check_split(model: torch.nn.Module, split: object, inputs: tuple[torch.Tensor, ...]) -> None:
    """Run ``model`` and ``split`` (a :class:`~medsplit.cutting.split.SplitModel`) on one
    random batch, in training mode and then in evaluation mode, each from the same random
    stream, and compare outputs and, after training mode, buffers (batch-norm statistics).

    ``model`` is the traced copy, whose parameters and buffers the segments share: its
    buffers, every module's flag and the random stream are restored afterwards.

    Raises:
        CutError: they differ; the message names the first module whose output differs
            and the mode.
    """
    segments = split.segments  # type: ignore[attr-defined]
    batch = _check_batch(inputs)
    with _kept((model, *segments)), torch.random.fork_rng(devices=[]), torch.no_grad():
        for training in (True, False):
            before = _buffers(model)
            expected, after = _run_model(model, batch, training)
            _restore(model, before)
            for segment in segments:
                segment.train(training)
            torch.manual_seed(CHECK_SEED)
            got = split.forward(*batch)  # type: ignore[attr-defined]
            if _same(expected, got):
                stale = _first_stale_buffer(after, model) if training else None
                if stale is None:
                    continue
                where = stale
            else:
                _restore(model, before)
                where = _first_difference(model, segments, batch, training)
            mode = "training" if training else "evaluation"
            cuts = list(split.cuts)  # type: ignore[attr-defined]
            raise CutError(
                f"cut at {cuts}, the segments do not compute what {type(model).__name__} "
                f"computes in {mode} mode: {where}. The model may keep hidden state, draw "
                "random numbers outside its modules' order, or read `self.training` in a "
                "way a trace cannot follow"
            )


def _run_model(
    model: torch.nn.Module,
    batch: tuple[torch.Tensor, ...],
    training: bool,
    outputs: dict[str, object] | None = None,
) -> tuple[object, dict[str, torch.Tensor]]:
    """The model's output from the check's seed, and its buffers afterwards; with
    ``outputs``, every submodule's first output too."""
    model.train(training)
    hooks = []
    if outputs is not None:
        for name, module in model.named_modules():
            if name:
                hook = module.register_forward_hook(
                    lambda _m, _i, out, name=name: outputs.setdefault(name, out)
                )
                hooks.append(hook)
    try:
        torch.manual_seed(CHECK_SEED)
        out = model(*batch)
    finally:
        for hook in hooks:
            hook.remove()
    return out, _buffers(model)


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.clone() for name, b in model.named_buffers()}


def _restore(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    for name, b in model.named_buffers():
        b.copy_(saved[name])


def _check_batch(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Random values of the example's shape (zeros would hide dropout), batch at least 2
    (batch norm in training mode needs two values per channel)."""
    generator = torch.Generator().manual_seed(CHECK_SEED)
    out = []
    for t in inputs:
        shape = (max(2, t.shape[0]), *t.shape[1:])
        if t.is_floating_point():
            out.append(torch.randn(shape, generator=generator, dtype=t.dtype).to(t.device))
        else:
            out.append(t.repeat(2, *([1] * (t.dim() - 1)))[: shape[0]])
    return tuple(out)


@contextmanager
def _kept(modules: tuple[torch.nn.Module, ...]) -> Iterator[None]:
    flags = [{m: m.training for m in module.modules()} for module in modules]
    buffers = [_buffers(module) for module in modules]
    try:
        yield
    finally:
        for module, flag, saved in zip(modules, flags, buffers, strict=True):
            for sub, value in flag.items():
                sub.training = value
            with torch.no_grad():
                _restore(module, saved)


def _first_stale_buffer(expected: dict[str, torch.Tensor], model: torch.nn.Module) -> str | None:
    for name, buffer in model.named_buffers():
        if not torch.equal(buffer, expected[name]):
            return f"buffer {name!r} (batch-norm statistics, say) is updated differently"
    return None


def _first_difference(
    model: torch.nn.Module, segments: tuple, batch: tuple[torch.Tensor, ...], training: bool
) -> str:
    """The first module, in forward order, whose output differs between the two."""
    before = _buffers(model)
    outputs: dict[str, object] = {}
    _run_model(model, batch, training, outputs)
    _restore(model, before)
    torch.manual_seed(CHECK_SEED)
    values = _segment_values(segments, batch, training)
    for name, out in outputs.items():
        mine = values.get(name)
        tensors = isinstance(out, torch.Tensor) and isinstance(mine, torch.Tensor)
        if tensors and out.shape == mine.shape and not torch.equal(out, mine):
            kind = type(model.get_submodule(name)).__name__
            return f"the output of module {name!r} ({kind}) differs first"
    return "the outputs differ"


class _Recording(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, n: fx.Node) -> object:
        self.values[n] = super().run_node(n)
        return self.values[n]


def _segment_values(segments: tuple, batch: tuple[torch.Tensor, ...], training: bool) -> dict:
    """Each module's output as the segments compute it: the value of the last node in
    its scope."""
    values: dict[str, object] = {}
    args: tuple[object, ...] = batch
    for segment in segments:
        graph = segment.graphs[training]
        interpreter = _Recording(fx.GraphModule(segment, graph))
        out = interpreter.run(*args)
        for node, value in interpreter.values.items():
            for path in module_path_stack(node):
                values[path] = value
        args = tuple(out.values()) if isinstance(out, dict) else (out,)
    return values


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b
