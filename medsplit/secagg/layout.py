"""A state dict as one flat float32 vector and back, in an order both sides agree on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from medsplit.secagg.errors import SecAggError

__all__ = ["VectorLayout"]


@dataclass(frozen=True)
class VectorLayout:
    """The names and shapes of a state dict's tensors, in sorted name order.

    Every participant builds it from its own front (all fronts have the same shapes), and
    the aggregator is told its :attr:`length` only.
    """

    entries: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> VectorLayout:
        """The layout of ``state``; every tensor must be float32.

        Raises:
            SecAggError: empty, or a tensor is not float32 (buffers such as BatchNorm's
                ``num_batches_tracked`` are not averaged here: leave them out).
        """
        if not state:
            raise SecAggError("cannot aggregate an empty state dict")
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
                got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise SecAggError(
                    f"{name!r} is {got}; secure aggregation averages float32 tensors only: "
                    "leave integer buffers (num_batches_tracked) out of the state it is given"
                )
        return cls(tuple((name, tuple(state[name].shape)) for name in sorted(state)))

    @property
    def length(self) -> int:
        """The number of values in the flat vector."""
        return sum(_numel(shape) for _, shape in self.entries)

    def flatten(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The tensors of ``state`` concatenated in this layout's order (float32, 1-D).

        Raises:
            SecAggError: ``state`` has other names, shapes or dtypes than this layout.
        """
        if VectorLayout.of(state) != self:
            raise SecAggError(
                "the state dict does not match the round's layout (other names, shapes or "
                f"dtypes): expected {[name for name, _ in self.entries][:8]}..."
            )
        return torch.cat([state[name].detach().reshape(-1) for name, _ in self.entries])

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """The state dict of a flat vector of :attr:`length` values (copies)."""
        if vector.dim() != 1 or vector.numel() != self.length:
            raise SecAggError(f"expected a 1-D vector of {self.length} values, got {vector.shape}")
        out: dict[str, torch.Tensor] = {}
        start = 0
        for name, shape in self.entries:
            size = _numel(shape)
            out[name] = vector[start : start + size].reshape(shape).clone()
            start += size
        return out


def _numel(shape: tuple[int, ...]) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size
