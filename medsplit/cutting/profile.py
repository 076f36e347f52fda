"""One forward pass over a traced graph that records, per node, what it outputs and costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx
from torch.utils.flop_counter import FlopCounterMode

from medsplit.errors import CutError


@dataclass(frozen=True)
class NodeProfile:
    """What one graph node produced on the example input.

    ``shape`` and ``dtype`` are ``None`` when the node's value is not a tensor (a size,
    a tuple, ``None``), which is why such a node can never cross a cut.
    """

    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    flops: int


class _ProfilingInterpreter(fx.Interpreter):
    def __init__(self, module: fx.GraphModule, *, flops: bool) -> None:
        super().__init__(module)
        self.profiles: dict[fx.Node, NodeProfile] = {}
        self.flops = flops

    def run_node(self, n: fx.Node) -> object:
        if not self.flops:
            return self._record(n, super().run_node(n), 0)
        # One counter per node gives per-node FLOPs, so prefix sums price every cut at once.
        with FlopCounterMode(display=False) as counter:
            out = super().run_node(n)
        return self._record(n, out, counter.get_total_flops())

    def _record(self, n: fx.Node, out: object, flops: int) -> object:
        if isinstance(out, torch.Tensor):
            self.profiles[n] = NodeProfile(tuple(out.shape), out.dtype, flops)
        else:
            self.profiles[n] = NodeProfile(None, None, flops)
        return out


def profile_graph(
    gm: fx.GraphModule, example_input: tuple[torch.Tensor, ...], *, flops: bool = True
) -> dict[fx.Node, NodeProfile]:
    """Run ``gm`` once in eval mode without gradients and profile every node.

    Eval mode keeps batch-norm running statistics untouched (an exported graph, whose
    modes are fixed, has its buffers and the random stream restored instead); every
    module's own training flag is restored afterwards. With ``flops=False`` only
    shapes are recorded (FLOPs read 0), several times faster.

    Raises:
        CutError: the model does not run on the example (say, an image too small for it).

    Note:
        FLOPs are those ``torch.utils.flop_counter`` counts: matrix products and
        convolutions (2 per multiply-add); element-wise work is not counted.
    """
    flags = {m: m.training for m in gm.modules()}
    buffers = {name: b.clone() for name, b in gm.named_buffers()}
    gm.eval()
    interpreter = _ProfilingInterpreter(gm, flops=flops)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            interpreter.run(*example_input)
    except Exception as e:  # the model's own checks raise anything, torch._assert included
        shapes = ", ".join(str(list(t.shape)) for t in example_input)
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CutError(
            f"{type(gm).__name__} does not run on an input of shape {shapes}: {first_line}"
        ) from e
    finally:
        for module, flag in flags.items():
            module.training = flag
        with torch.no_grad():
            for name, b in gm.named_buffers():
                b.copy_(buffers[name])
    return interpreter.profiles


def as_example_inputs(
    example_input: torch.Tensor | Sequence[torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    """Normalise an example input to a tuple of batch-first tensors."""
    inputs = (example_input,) if isinstance(example_input, torch.Tensor) else tuple(example_input)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise CutError("example_input must be a tensor or a sequence of tensors")
    if inputs[0].dim() == 0:
        raise CutError("example_input must be batch-first (dimension 0 is the batch)")
    return inputs
