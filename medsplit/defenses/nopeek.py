"""NoPeek (Vepakomma et al., 2020): ``weight · dCor²(x, A)`` between a batch's inputs and
the activations its front computes, added to the front's backward pass at the hospital.

The term is never part of a loss the hospital computes: the activations pass through
:class:`NoPeekTerm`, the identity forward, whose backward adds the term's gradient with
respect to the activations to the gradient that came from the server. So the front gets
the gradient of ``task loss + weight · dCor²`` in every mode, vanilla included, where the
task's loss is the server's.
"""

from __future__ import annotations

from typing import Any

import torch

from medsplit.defenses.distance import distance_correlation_sqr_torch

__all__ = ["NoPeekTerm", "nopeek_outputs"]


def _joined(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)


class NoPeekTerm(torch.autograd.Function):
    """Identity on the activations; backward adds ``∂(weight · dCor²(x, A))/∂A``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: float, *tensors: torch.Tensor) -> Any:
        ctx.save_for_backward(x, *tensors)
        ctx.weight = weight
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        x, *tensors = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in tensors]
            term = ctx.weight * distance_correlation_sqr_torch(x, _joined(tuple(leaves)))
            extra = torch.autograd.grad(term, leaves, allow_unused=True)
        out = []
        for g, e in zip(grads, extra, strict=True):
            if e is None:
                out.append(g)
            elif g is None:
                out.append(e)
            else:
                out.append(g + e)
        return (None, None, *out)


def nopeek_outputs(
    x: torch.Tensor, outputs: dict[str, torch.Tensor], weight: float
) -> dict[str, torch.Tensor]:
    """``outputs`` through :class:`NoPeekTerm` (its floating tensors; the others as they are)."""
    names = [n for n, t in outputs.items() if t.is_floating_point() and t.requires_grad]
    if not names:
        return dict(outputs)
    passed = NoPeekTerm.apply(x, weight, *(outputs[n] for n in names))
    out = dict(outputs)
    out.update(zip(names, passed, strict=True))
    return out


def nopeek_penalty(
    x: torch.Tensor, outputs: dict[str, torch.Tensor], weight: float
) -> torch.Tensor:
    """The term itself, ``weight · dCor²(x, A)`` (a reference: what the tests compare to)."""
    names = [n for n, t in outputs.items() if t.is_floating_point()]
    return weight * distance_correlation_sqr_torch(x, _joined(tuple(outputs[n] for n in names)))
