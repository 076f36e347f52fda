"""A hospital's segments as secure aggregation takes them, and the average back as a state.

Shared by the in-process job (:mod:`medsplit.training.parallel`) and the agent, so that
both average the same tensors the same way: the float32 tensors of the hospital's parties
(keyed ``"<party>.<name>"``, as ``combine_exported`` keys them) go through the masked sum;
the integer buffers (BatchNorm's ``num_batches_tracked``) count batches, are public, and
are combined by their maximum in the clear (:func:`~medsplit.modes.averaging.combine_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from medsplit.errors import ConfigError
from medsplit.modes.averaging import combine_counts, split_state
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.party import Party

__all__ = [
    "MAX_COUNT",
    "CountsError",
    "aggregation_parts",
    "averaged_export",
    "counts_from_json",
    "counts_to_json",
    "load_party_state",
    "party_state",
]

#: The largest integer buffer value accepted from another hospital (a batch count).
MAX_COUNT = 2**53


class CountsError(ConfigError):
    """Another hospital's integer buffers do not fit this hospital's (names, shapes, range)."""


def party_state(parties: Mapping[str, Party]) -> dict[str, torch.Tensor]:
    """The parties' weights keyed ``"<party>.<name>"`` (as ``combine_exported`` keys them)."""
    return {
        f"{name}.{key}": value
        for name, party in parties.items()
        for key, value in party.module.state_dict().items()
    }


def load_party_state(parties: Mapping[str, Party], state: Mapping[str, torch.Tensor]) -> None:
    """Load ``state`` (keyed as :func:`party_state` keys it) into ``parties``."""
    for name, party in parties.items():
        own = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(f"{name}.")}
        party.module.load_state_dict(own)


def aggregation_parts(
    parties: Mapping[str, Party],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The parties' float32 tensors (masked and summed) and their integer buffers."""
    return split_state(party_state(parties))


def averaged_export(
    fresh: Mapping[str, Party],
    average: Mapping[str, torch.Tensor],
    counts: Sequence[Mapping[str, torch.Tensor]],
) -> bytes:
    """The state the next round starts from: ``average`` (the float32 tensors) and the
    maximum of every hospital's ``counts``, loaded into ``fresh`` parties (their
    optimizers start afresh, as federated averaging restarts them) and exported."""
    combined = dict(average)
    combined.update(combine_counts(list(counts)))
    load_party_state(fresh, combined)
    return export_parties(fresh)


def counts_to_json(counts: Mapping[str, torch.Tensor]) -> dict[str, list[int]]:
    """Integer buffers as JSON: each flattened to a list of ints (their shapes are the
    model's, which every hospital knows)."""
    return {name: [int(v) for v in t.reshape(-1).tolist()] for name, t in sorted(counts.items())}


def counts_from_json(data: Any, like: Mapping[str, torch.Tensor], *, of: str) -> dict[str, Any]:
    """Another hospital's integer buffers, checked against this hospital's own ``like``.

    Raises:
        CountsError: other names, another number of values, or a value out of range;
            ``of`` names the hospital.
    """
    if not isinstance(data, dict) or sorted(data) != sorted(like):
        raise CountsError(
            f"the integer buffers {of} reported are not this model's "
            f"({sorted(like)[:4]}...): another model or a hostile report"
        )
    out = {}
    for name, mine in like.items():
        values = data[name]
        ok = isinstance(values, list) and len(values) == mine.numel()
        ok = ok and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT for v in values
        )
        if not ok:
            raise CountsError(
                f"{of} reported {name!r} as other than {mine.numel()} integers in [0, {MAX_COUNT}]"
            )
        out[name] = torch.tensor(values, dtype=mine.dtype).reshape(mine.shape)
    return out
