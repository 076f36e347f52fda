"""A vertical party's turn: its aligned records and its share of the job's model.

In a vertical job every party takes every step of a round, on the same records in the
same order (the alignment, :mod:`hospital_agent.alignment`); each keeps its own front (the
label party its head too) from round to round, and seals it for nobody. What the turn
runs on is built here; :class:`~hospital_agent.turns.TurnTaker` runs it like any turn.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from hospital_agent.data.problems import DataProblem
from medsplit.data import DataSplit
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole
from medsplit.psi import Alignment
from medsplit.training.config import TrainingConfig
from medsplit.training.party_models import PartyFront
from medsplit.training.schedule import Batch, turn_limits
from medsplit.training.setup import JobModel
from medsplit.training.vertical_parts import (
    aligned_split,
    job_vertical_model,
    participants_in_order,
    party_batches,
    party_parties,
    party_role,
)


@dataclass(frozen=True)
class VerticalTurn:
    """What a vertical party's turn runs on (the arguments its TurnClient takes)."""

    data: DataSplit
    start: bytes
    parties: Callable[[], dict[str, Party]]
    role: Callable[[dict[str, Party]], ClientRole]
    batches: Callable[[int], Iterator[Batch]]
    limits: FrameLimits
    label_party: bool


def vertical_turn(
    *,
    config: TrainingConfig,
    job_model: JobModel,
    participants: list[dict],
    me: str,
    position: int,
    round_index: int,
    alignment: Alignment,
    features: torch.Tensor,
    labels: torch.Tensor | None,
    own_state: Path,
    fronts: tuple[PartyFront, ...] = (),
) -> VerticalTurn:
    """``me``'s turn of round ``round_index`` over its aligned ``features`` (and
    ``labels``, the label party's): it starts from the seeded models' segments in the
    first round and from its own state (``own_state``) after. ``fronts``: the parties
    that run a model of their own (the job's ``party_models``).

    Raises:
        DataProblem: the features are not of this party's input shape (its own model's,
            else the job's), or the label party holds no labels; its own state of an
            earlier round is missing.
    """
    own = {front.party: front.model for front in fronts}.get(me, job_model)
    shape = tuple(own.input_shape)
    if tuple(features.shape[1:]) != shape:
        whose = "this party's own model's" if own is not job_model else "the job's"
        raise DataProblem(
            f"this party's records are {tuple(features.shape[1:])}, {whose} input is "
            f"{shape}: a vertical job runs each party's model on its records as they are"
        )
    order = participants_in_order(participants)
    model = job_vertical_model(job_model, config, order, tuple(fronts))
    label_party = order[0] == me
    if label_party and labels is None:
        raise DataProblem(
            "this hospital is the vertical job's label party (its first participant) but "
            "its records hold no labels: give its data a label column"
        )
    data = aligned_split(features, labels if label_party else None)
    if round_index == 0:
        start = export_parties(party_parties(model, config, me))
    elif own_state.exists():
        start = own_state.read_bytes()
    else:
        raise DataProblem(
            f"this party's own state after round {round_index - 1} is gone ({own_state}): a "
            "vertical party keeps its segments itself, and no other party holds them"
        )
    return VerticalTurn(
        data=data,
        start=start,
        parties=functools.partial(party_parties, model, config, me),
        role=functools.partial(party_role, model, config, me),
        batches=functools.partial(_batches, config, alignment, data, position),
        limits=turn_limits(config, num_classes=job_model.num_classes, train=len(alignment), val=0),
        label_party=label_party,
    )


def _batches(
    config: TrainingConfig, alignment: Alignment, data: DataSplit, position: int, round_: int
) -> Iterator[Batch]:
    return party_batches(config, alignment, data, round_=round_, position=position)
