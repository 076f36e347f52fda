"""The one multi-input model a vertical job trains: a front per party, a join, the top.

Each party's model is cut where the job says; its first segment is that party's front.
The label party's model gives the rest: the top (the server's) and, with the labels at
home, the head. :class:`VerticalModel` runs the whole thing in one process: it is both
what the split job's parties hold, segment by segment, and the unsplit model it must
equal bit for bit (:func:`train_vertical_unsplit`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from medsplit.cutting import BoundaryTensor, split_model
from medsplit.errors import ConfigError
from medsplit.modes import SplitMode
from medsplit.modes.joins import CONCAT, join_embeddings, single_crossing
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn, eval_mode
from medsplit.training.config import TrainingConfig


@dataclass(frozen=True)
class PartyModel:
    """One party's model, an example of its input (batch first) and where to cut it.

    Attributes:
        model: the party's whole network (only its front is used, but the label party's).
        example: a batch-first example of the party's own input.
        cuts: the cut of its front; the label party's gives the mode's cuts (one, or two
            with the labels at home: front, top, head).
    """

    model: nn.Module
    example: torch.Tensor
    cuts: tuple[str, ...]


class ConcatProjection(nn.Module):
    """The start of the top when the join concatenates: a learned projection from the
    joined channels to those the label party's top takes, then that top unchanged."""

    def __init__(self, top: nn.Module, *, name: str, joined: int, channels: int, dims: int):
        super().__init__()
        self.name = name
        if dims == 0:
            self.projection: nn.Module = nn.Linear(joined, channels)
        else:
            conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
            self.projection = conv(joined, channels, kernel_size=1)
        self.top = top

    def forward(self, **inputs: torch.Tensor) -> object:
        return self.top(**{self.name: self.projection(inputs[self.name])})


class VerticalModel(nn.Module):
    """Fronts by party, joined, through the top (and the head).

    Attributes:
        fronts: each party's front, in the parties' order (the join's order).
        top: the server's segment; takes the joined tensor as ``top_input``.
        head: the label party's last segment, or ``None`` with the labels at the server.
        inputs: the one tensor each front sends.
        head_boundary: what crosses from the top to the head (``None`` without a head).
    """

    def __init__(
        self,
        *,
        fronts: Mapping[str, nn.Module],
        inputs: Mapping[str, BoundaryTensor],
        top: nn.Module,
        top_input: str,
        head: nn.Module | None,
        head_boundary: tuple[BoundaryTensor, ...] | None,
        join: str,
        label_party: str,
    ):
        super().__init__()
        self.fronts = nn.ModuleDict(dict(fronts))
        self.top = top
        self.head = head
        self.inputs = dict(inputs)
        self.top_input = top_input
        self.head_boundary = head_boundary
        self.join = join
        self.label_party = label_party

    @property
    def parties(self) -> list[str]:
        return list(self.fronts)

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        embeddings = [self.fronts[p](inputs[p])[self.inputs[p].name] for p in self.parties]
        out = self.top(**{self.top_input: join_embeddings(self.join, embeddings)})
        return self.head(**out) if self.head is not None else out


def build_vertical(
    parts: Mapping[str, PartyModel],
    *,
    mode: SplitMode,
    label_party: str,
    seed: int = 0,
) -> VerticalModel:
    """Cut each party's model and assemble the vertical model (the models untouched).

    With ``concat`` the top starts with a projection (seeded by ``seed``) from the
    joined channels to the label party's, so its model's back serves after it.

    Raises:
        ConfigError: fewer than two parties, the label party missing, a front whose cut
            lets more than one tensor cross, or embeddings the join cannot combine.
        CutError: a model cannot be cut there.
    """
    join = mode.embedding_join()
    if join is None:
        raise ConfigError(f"{mode.name} mode joins no parties' embeddings: not a vertical mode")
    if len(parts) < 2 or label_party not in parts:
        raise ConfigError(
            f"a vertical job needs two or more parties, the label party among them; got "
            f"{sorted(parts)} with label party {label_party!r}"
        )
    own = parts[label_party]
    cuts = mode.check_cuts(own.cuts)
    fronts, inputs, examples = {}, {}, {}
    for name, part in parts.items():
        if name != label_party and len(part.cuts) != 1:
            raise ConfigError(
                f"vertical party {name!r} holds only its front: give it one cut, got "
                f"{list(part.cuts)}"
            )
        split = split_model(part.model, part.example, cuts if name == label_party else part.cuts)
        fronts[name] = copy.deepcopy(split.segments[0])
        inputs[name] = single_crossing(split.boundaries[0], party=name)
        if name == label_party:
            rest = split
        with eval_mode([fronts[name]]), torch.no_grad():
            examples[name] = fronts[name](part.example)[inputs[name].name]
    top_input = inputs[label_party].name
    top: nn.Module = copy.deepcopy(rest.segments[1])
    joined = join_embeddings(join, [examples[p] for p in parts])
    if join == CONCAT:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            top = ConcatProjection(
                top,
                name=top_input,
                joined=int(joined.shape[1]),
                channels=int(examples[label_party].shape[1]),
                dims=joined.dim() - 2,
            )
    head = copy.deepcopy(rest.segments[2]) if len(cuts) == 2 else None
    segments = {f"the front of {name!r}": front for name, front in fronts.items()}
    segments["the top (the server's)"] = top
    if head is not None:
        segments[f"the head of {label_party!r}"] = head
    for where, segment in segments.items():
        if not any(True for _ in segment.parameters()):
            raise ConfigError(
                f"{where} holds no parameters, so that party would have nothing to train; "
                f"cut {label_party!r}'s model at {list(cuts)} elsewhere (`medsplit cuts MODEL`)"
            )
    return VerticalModel(
        fronts=fronts,
        inputs=inputs,
        top=top,
        top_input=top_input,
        head=head,
        head_boundary=rest.boundaries[1] if len(cuts) == 2 else None,
        join=join,
        label_party=label_party,
    )


def vertical_parties(model: VerticalModel, config: TrainingConfig) -> dict[str, dict[str, Party]]:
    """Fresh parties of every participant, own copies: each party's ``front`` (and the
    label party's ``head``), and the server's ``top``, keyed by participant."""
    out: dict[str, dict[str, Party]] = {
        name: {"front": Party.create(copy.deepcopy(front), config.client_optimizer)}
        for name, front in model.fronts.items()
    }
    if model.head is not None:
        out[model.label_party]["head"] = Party.create(
            copy.deepcopy(model.head), config.client_optimizer
        )
    out["server"] = {"top": Party.create(copy.deepcopy(model.top), config.server_optimizer)}
    return out


def assemble(model: VerticalModel, parties: Mapping[str, Mapping[str, Party]]) -> VerticalModel:
    """A copy of ``model`` holding the weights the parties hold now."""
    whole = copy.deepcopy(model)
    for name in whole.fronts:
        whole.fronts[name].load_state_dict(parties[name]["front"].module.state_dict())
    whole.top.load_state_dict(parties["server"]["top"].module.state_dict())
    if whole.head is not None:
        whole.head.load_state_dict(parties[model.label_party]["head"].module.state_dict())
    return whole


def train_vertical_unsplit(
    model: VerticalModel,
    batches: Iterable[tuple[Mapping[str, torch.Tensor], torch.Tensor]],
    config: TrainingConfig,
    *,
    loss_fn: LossFn | None = None,
) -> VerticalModel:
    """Train a copy of ``model`` whole on ``batches`` (each party's inputs and the
    labels), each segment with the optimizer it has in the split job.

    Returns:
        The trained copy; ``model`` itself is not modified.
    """
    whole = copy.deepcopy(model)
    parties = [Party.create(front, config.client_optimizer) for front in whole.fronts.values()]
    parties.append(Party.create(whole.top, config.server_optimizer))
    if whole.head is not None:
        parties.append(Party.create(whole.head, config.client_optimizer))
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    for inputs, labels in batches:
        loss_fn(whole(inputs), labels).backward()
        for party in parties:
            party.step()
    return whole


def image_parts(images: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``images`` (N, C, H, W…) as ``parts`` images that each keep one band of columns
    (the last dimension) and zeros elsewhere: K parties holding different parts of every
    image, each part the model's own input shape, so every party runs the same front."""
    if parts < 2:
        raise ConfigError(
            f"a vertical job splits each image between 2 or more parties, got {parts}"
        )
    width = images.shape[-1]
    if parts > width:
        raise ConfigError(f"images {width} wide cannot be split between {parts} parties")
    edges = [round(i * width / parts) for i in range(parts + 1)]
    out = []
    for start, stop in itertools.pairwise(edges):
        part = torch.zeros_like(images)
        part[..., start:stop] = images[..., start:stop]
        out.append(part)
    return out


def same_model_parts(
    model: nn.Module, example: torch.Tensor, cuts: Sequence[str], parties: Sequence[str]
) -> dict[str, PartyModel]:
    """Every party with its own copy of one model (the label party, first, with all the
    mode's cuts; the others cut at the first)."""
    return {
        name: PartyModel(model, example, tuple(cuts) if i == 0 else (cuts[0],))
        for i, name in enumerate(parties)
    }
