"""What each side of a vertical job builds from its description, identically.

On the platform every party runs the job's model on its own features of the same
patients (its own copy of the model's front), or a model of its own where the job's
``party_models`` names one (a table's rows through ``tabular_mlp``); the label party is
the job's first participant and always runs the job's model. The worker and every agent
build the same :class:`VerticalModel` from the job's models, seed and participants, so
the top's starting weights and each front's are the segments of seeded models, without
any weights crossing. Each side then takes its
share: a party its front (the label party its head too), the worker the top.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Sequence

import torch

from medsplit.data import DataSplit
from medsplit.errors import ConfigError
from medsplit.modes import SplitMode
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, StepIds
from medsplit.psi import Alignment
from medsplit.training.config import TrainingConfig
from medsplit.training.party_models import PartyFront
from medsplit.training.schedule import Batch
from medsplit.training.setup import JobModel
from medsplit.training.vertical_job import LabelBoundaries, aligned_steps
from medsplit.training.vertical_model import (
    PartyModel,
    VerticalModel,
    build_vertical,
    same_model_parts,
)


def vertical_mode(config: TrainingConfig) -> SplitMode:
    """The job's mode, which must be one whose parties hold different features.

    Raises:
        ConfigError: the job's mode is another.
    """
    mode = config.split_mode
    if not mode.feature_sets or mode.embedding_join() is None:
        raise ConfigError(f"a vertical turn in a job of mode {config.mode!r}")
    return mode


@functools.lru_cache(maxsize=4)
def job_vertical_model(
    model: JobModel,
    config: TrainingConfig,
    participants: tuple[str, ...],
    fronts: tuple[PartyFront, ...] = (),
) -> VerticalModel:
    """The job's vertical model over ``participants`` (in position order, the first the
    label party): each party with its own copy of ``model``'s front, or of its own model's
    where ``fronts`` names one; built once per process. Parties take their own copies of
    its segments (:func:`party_parties`).

    Raises:
        ConfigError: ``fronts`` names the label party or a hospital not taking part, or
            the models do not fit together (:func:`build_vertical`).
        CutError: a party's model cannot be cut where its entry says.
    """
    own = {front.party: front for front in fronts}
    strangers = sorted(set(own) - set(participants[1:]))
    if strangers:
        raise ConfigError(
            f"the job's party_models name {strangers}, which are not among its parties "
            f"other than the label party {participants[0]!r} (it runs the job's model): "
            f"{list(participants[1:])}"
        )
    example = torch.zeros(2, *model.input_shape)
    parts = same_model_parts(model.build(), example, config.cuts, list(participants))
    for name, front in own.items():
        parts[name] = PartyModel(
            front.model.build(), torch.zeros(2, *front.model.input_shape), (front.cut,)
        )
    return build_vertical(
        parts, mode=vertical_mode(config), label_party=participants[0], seed=config.seed
    )


def party_parties(model: VerticalModel, config: TrainingConfig, me: str) -> dict[str, Party]:
    """Fresh parties of ``me``: its front, and the head for the label party."""
    parties = {"front": Party.create(copy.deepcopy(model.fronts[me]), config.client_optimizer)}
    if me == model.label_party and model.head is not None:
        parties["head"] = Party.create(copy.deepcopy(model.head), config.client_optimizer)
    return parties


def party_role(
    model: VerticalModel,
    config: TrainingConfig,
    me: str,
    parties: dict[str, Party],
    *,
    loss_fn: LossFn | None = None,
) -> ClientRole:
    """``me``'s step role: the label party's (U-shaped's or vanilla's client, by the
    labels option) or a passive party's front."""
    mode = vertical_mode(config)
    if me == model.label_party:
        return mode.client_role(
            parties, LabelBoundaries(model), codec=config.codec, loss_fn=loss_fn
        )  # type: ignore[arg-type]
    return mode.passive_role(parties["front"], (model.inputs[me],), codec=config.codec)


def aligned_split(features: torch.Tensor, labels: torch.Tensor | None) -> DataSplit:
    """A party's aligned rows (images, or a table's rows) as a data split (a passive
    party's labels are zeros: it has none, and its frames carry none)."""
    if labels is None:
        labels = torch.zeros(len(features), dtype=torch.int64)
    return DataSplit(features, labels)


def party_batches(
    config: TrainingConfig,
    alignment: Alignment,
    data: DataSplit,
    *,
    round_: int,
    position: int,
) -> Iterator[Batch]:
    """A party's batches of round ``round_``: its rows (in alignment order) of each step's
    aligned positions, as every party derives them from the job's seed."""
    for step, positions in enumerate(aligned_steps(config, alignment, round_)):
        index = torch.tensor(positions)
        ids = StepIds(config.job, round_, position, step)
        yield Batch(ids, position, data.images[index], data.labels[index])


def participants_in_order(participants: Sequence[dict]) -> tuple[str, ...]:
    """The participants' hospital names by position (the first is the label party)."""
    return tuple(p["hospital"] for p in sorted(participants, key=lambda p: p["position"]))
