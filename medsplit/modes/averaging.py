"""Averaging of party states, as a mode that aggregates combines them.

The float32 tensors are averaged in the fixed-point arithmetic of :mod:`medsplit.secagg`,
so that an average computed in the clear equals, bit for bit, what secure aggregation
yields; integer buffers (``num_batches_tracked``) count batches, are public, and are
combined by their maximum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from medsplit.errors import ConfigError, RoundPlanError
from medsplit.secagg.fixedpoint import FixedPoint, clear_weighted_sum
from medsplit.secagg.layout import VectorLayout


def split_state(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``state`` as its float32 tensors (averaged) and the others (integer buffers such as
    ``num_batches_tracked``, which count batches and are combined by their maximum)."""
    floats = {k: v for k, v in state.items() if v.dtype == torch.float32}
    others = {k: v for k, v in state.items() if v.dtype != torch.float32}
    bad = [k for k, v in others.items() if v.is_floating_point() or v.is_complex()]
    if bad:
        raise ConfigError(
            f"averaging takes float32 tensors only; {bad[:4]} are "
            f"{state[bad[0]].dtype}: train the model in float32"
        )
    return floats, others


def combine_counts(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The integer buffers of ``states``, element-wise maximum (public: batch counts)."""
    if not states:
        return {}
    return {k: torch.stack([s[k] for s in states]).amax(dim=0) for k in states[0]}


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[int],
    fixed: FixedPoint | None = None,
) -> dict[str, torch.Tensor]:
    """``Σ n_i s_i / Σ n_i`` of the float32 tensors of ``states`` in the clear, in the
    fixed-point arithmetic of :mod:`medsplit.secagg.fixedpoint` (the integer buffers by
    their maximum, :func:`combine_counts`).

    Raises:
        RoundPlanError: no state, or not one weight per state.
        FixedPointError, SecAggError: a value does not fit the ring, or a state is empty
            or differs in names or shapes from the first.
    """
    if not states or len(states) != len(weights):
        raise RoundPlanError(
            f"averaging takes one or more states with one weight each, got "
            f"{len(states)} states and {len(weights)} weights"
        )
    fixed = fixed or FixedPoint()
    parts = [split_state(s) for s in states]
    layout = VectorLayout.of(parts[0][0])
    vectors = [layout.flatten(floats) for floats, _ in parts]
    ring = clear_weighted_sum(vectors, list(weights), fixed)
    averaged = layout.unflatten(fixed.decode(ring, sum(weights)))
    averaged.update(combine_counts([others for _, others in parts]))
    return {k: averaged[k] for k in states[0]}
