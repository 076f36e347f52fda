"""Run a vertical split-learning job in one process: every party at every step.

The parties first align their records by private set intersection (the label party the
client of one real PSI session with each other party, :mod:`medsplit.psi`), receive the
K-way intersection as bytes, check its digest against the label party's, and map it to
their own rows. Each step then takes the same records from every party, in an order each
derives from the job's seed (:func:`medsplit.psi.epoch_batches`); every frame goes
through a real channel as encoded bytes, as between processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from medsplit.channel import Channel, InMemoryChannel, RelayKeys
from medsplit.errors import ConfigError
from medsplit.modes.base import JointServerRole
from medsplit.protocol.roles import ClientRole, LossFn, StepIds, StepResult, eval_mode
from medsplit.psi import Alignment, PsiClient, PsiServer, align, epoch_batches
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import defended_role
from medsplit.training.evaluate import classification_metrics
from medsplit.training.label_leakage import LeakageScores
from medsplit.training.schedule import turn_length, turn_limits
from medsplit.training.split_job import RoundReport
from medsplit.training.vertical_model import VerticalModel, assemble, vertical_parties
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameSpec, decode_frame, encode_frame


@dataclass(frozen=True)
class VerticalParty:
    """One party's own records: identifiers, features (a row each), labels if it has them.

    Attributes:
        name: the party's name.
        identifiers: a pseudonymous patient identifier per row of ``features``.
        features: the party's inputs, batch first, one row per identifier.
        labels: class indices per row, at the label party only.
    """

    name: str
    identifiers: tuple[str, ...]
    features: torch.Tensor
    labels: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.identifiers) != len(self.features):
            raise ConfigError(
                f"party {self.name!r}: {len(self.identifiers):,} identifiers for "
                f"{len(self.features):,} rows of features"
            )
        if self.labels is not None and len(self.labels) != len(self.features):
            raise ConfigError(
                f"party {self.name!r}: {len(self.labels):,} labels for "
                f"{len(self.features):,} rows of features"
            )


@dataclass
class VerticalRoundReport(RoundReport):
    """A round of a vertical job, with the label-leakage audit: for each passive party,
    each attack's AUC against the true labels (``{party: {"norm_auc": ...}}``)."""

    leakage: dict[str, dict[str, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class AlignedBatch:
    """One step's records: its ids, each party's inputs and the label party's labels."""

    ids: StepIds
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor


def aligned_steps(config: TrainingConfig, alignment: Alignment, round_: int) -> Iterator[list[int]]:
    """The aligned positions of each step of round ``round_``: ``local_epochs`` passes
    over the intersection (epoch ``round × local_epochs + e`` orders each, from the
    job's seed, :func:`medsplit.psi.epoch_batches`), capped at ``max_steps_per_turn``.
    Every party derives the same list alone; no index crosses."""
    cap = turn_length(config, len(alignment))
    step = 0
    for local in range(config.local_epochs):
        epoch = round_ * config.local_epochs + local
        for positions in epoch_batches(
            alignment, config.batch_size, seed=config.seed, epoch=epoch, drop_last=config.drop_last
        ):
            if step >= cap:
                return
            yield positions
            step += 1


def align_parties(
    parties: Sequence[VerticalParty], *, label_party: str, job: str, seed: int, minimum: int
) -> Alignment:
    """The K-way intersection as every party holds it, once every digest matched.

    The label party runs one PSI session as the client with each other party; each party
    then reads the alignment from the bytes handed to it and checks its digest.

    Raises:
        PsiError: a party's identifiers are malformed or duplicated.
        IntersectionTooSmall: fewer than ``minimum`` records are shared by all.
        DigestMismatch: a party received another intersection.
    """
    by_name = {p.name: p for p in parties}
    own = by_name[label_party].identifiers
    pairwise = []
    for party in parties:
        if party.name == label_party:
            continue
        session = f"{job}:{label_party}:{party.name}"
        client = PsiClient(own, session=session)
        server = PsiServer(party.identifiers, session=session)
        pairwise.append(client.intersect(server.answer(client.request())))
    alignment = align(own, pairwise, seed=seed, minimum=minimum)
    handed = alignment.to_bytes()
    for party in parties:
        received = Alignment.from_bytes(handed, seed=seed, minimum=minimum)
        received.check_digest(alignment.digest(), party=party.name)
    return alignment


class VerticalJob:
    """A vertical split-learning job over in-process parties.

    Args:
        model: the vertical model, initialised as the job starts (not modified).
        config: the training settings; its mode is ``vertical`` (with its options).
        parties: every party's records, the label party among them with its labels.
        minimum: the smallest intersection the job trains on (default: the mode's
            ``min_records``).
        channel: the channel frames travel on (a fresh in-memory one by default).
        loss_fn: loss on (logits, labels); cross-entropy by default.
        num_classes: the classes labels fall in (default: 1 + the largest label).

    Raises:
        ConfigError: the mode is not a vertical one, or the parties do not fit the model.
        PsiError: the alignment failed (see :func:`align_parties`).
    """

    def __init__(
        self,
        model: VerticalModel,
        config: TrainingConfig,
        parties: Sequence[VerticalParty],
        *,
        minimum: int | None = None,
        channel: Channel | None = None,
        loss_fn: LossFn | None = None,
        num_classes: int | None = None,
    ):
        mode = config.split_mode
        if mode.embedding_join() != model.join:
            raise ConfigError(
                f"a vertical job runs the vertical mode with the model's join "
                f"({model.join}); got mode {mode!r}"
            )
        names = [p.name for p in parties]
        if names != model.parties:
            raise ConfigError(f"the model's parties are {model.parties}, the data's {names}")
        label = model.label_party
        labels = {p.name: p.labels for p in parties}[label]
        if labels is None:
            raise ConfigError(f"the label party {label!r} holds no labels")
        self.mode, self.config, self.model = mode, config, model
        self.data = {p.name: p for p in parties}
        self.alignment = align_parties(
            parties,
            label_party=label,
            job=config.job,
            seed=config.seed,
            minimum=int(config.mode_options["min_records"]) if minimum is None else minimum,
        )
        self.rows = {
            p.name: torch.tensor(self.alignment.positions(p.identifiers, source=p.name))
            for p in parties
        }
        self.num_classes = num_classes if num_classes is not None else int(labels.max()) + 1
        self.channel = channel or InMemoryChannel()
        self.loss_fn = loss_fn
        self.parties = vertical_parties(model, config)

    # -- the batches ---------------------------------------------------------------------

    def batches(self, round_: int) -> Iterator[AlignedBatch]:
        """Round ``round_``'s steps (:func:`aligned_steps`), every party's rows of them."""
        label = self.data[self.model.label_party]
        assert label.labels is not None
        for step, positions in enumerate(aligned_steps(self.config, self.alignment, round_)):
            index = torch.tensor(positions)
            inputs = {n: p.features[self.rows[n][index]] for n, p in self.data.items()}
            labels = label.labels[self.rows[label.name][index]]
            yield AlignedBatch(StepIds(self.config.job, round_, 0, step), inputs, labels)

    def all_batches(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Every step's inputs and labels, rounds in order (for the unsplit reference)."""
        for round_ in range(self.config.rounds):
            for batch in self.batches(round_):
                yield batch.inputs, batch.labels

    # -- the step ------------------------------------------------------------------------

    def _roles(self) -> tuple[dict[str, ClientRole], JointServerRole]:
        cfg, model = self.config, self.model
        roles: dict[str, ClientRole] = {}
        for name in model.parties:
            parties = self.parties[name]
            if name == model.label_party:
                role = self.mode.client_role(
                    parties, LabelBoundaries(model), codec=cfg.codec, loss_fn=self.loss_fn
                )
            else:
                role = self.mode.passive_role(
                    parties["front"], (model.inputs[name],), codec=cfg.codec
                )
            # The job's defenses (NoPeek at every party, gradient noise at the label
            # party); activation noise is refused in this mode (TrainingConfig).
            roles[name] = defended_role(
                role,
                parties,
                cfg,
                records=len(self.alignment),
                round_=0,
                classes=self.num_classes,
            )
        limits = turn_limits(cfg, num_classes=self.num_classes, train=len(self.alignment), val=0)
        server = self.mode.joint_server_role(
            self.parties["server"]["top"],
            inputs=model.inputs,
            top_input=model.top_input,
            head_boundary=model.head_boundary,
            label_party=model.label_party,
            job=cfg.job,
            codec=cfg.codec,
            loss_fn=self.loss_fn,
            limits=limits,
        )
        return roles, server

    def _carry(self, stream: str, frame: Frame, expect: FrameSpec) -> tuple[Frame, int]:
        payload = encode_frame(frame, max_bytes=DEFAULT_MAX_FRAME_BYTES)
        self.channel.send(stream, payload)
        received = self.channel.receive(stream, timeout=30.0)
        return decode_frame(received, max_bytes=DEFAULT_MAX_FRAME_BYTES, expect=expect), len(
            payload
        )

    def _step(
        self, roles: Mapping[str, ClientRole], server: JointServerRole, batch: AlignedBatch
    ) -> StepResult:
        keys = RelayKeys()
        streams = {n: keys.streams(self.config.job, n) for n in roles}
        up = down = 0
        frames = {}
        for name, role in roles.items():
            frame = role.start(batch.ids, batch.inputs[name], batch.labels)
            frames[name], size = self._carry(streams[name].up, frame, server.expect(name))
            up += size
        replies = server.forward(frames)
        results: dict[str, StepResult] = {}
        while replies:
            pending = {}
            for name, reply in replies.items():
                frame, size = self._carry(streams[name].down, reply, roles[name].expect())
                down += size
                out = roles[name].receive(frame)
                if isinstance(out, StepResult):
                    results[name] = out
                else:
                    pending[name] = out
            replies = {}
            for name, frame in pending.items():
                carried, size = self._carry(streams[name].up, frame, server.expect(name))
                up += size
                replies.update(server.backward(carried))
        result = results[self.model.label_party]
        return dataclasses.replace(result, bytes_up=up, bytes_down=down)

    # -- the job -------------------------------------------------------------------------

    def run(
        self,
        *,
        on_step: Callable[[StepResult], None] | None = None,
        on_round: Callable[[VerticalRoundReport], None] | None = None,
    ) -> list[VerticalRoundReport]:
        """Every round; after each, the label-leakage audit of every passive party."""
        reports = []
        roles, server = self._roles()
        # A passive party's role keeps the gradient it received last (VerticalFront).
        passive = {n: r for n, r in roles.items() if n != self.model.label_party}
        for round_ in range(self.config.rounds):
            report = VerticalRoundReport(round_)
            scores = {name: LeakageScores() for name in passive}
            for batch in self.batches(round_):
                result = self._step(roles, server, batch)
                report.add(result)
                for name, role in passive.items():
                    received = getattr(role, "received", None)
                    if received is not None:
                        # The party's scores, the label party's labels: on the platform
                        # the scores go sealed to the label party, never the labels out.
                        scores[name].add(received, batch.labels)
                if on_step is not None:
                    on_step(result)
            report.leakage = {name: s.report() for name, s in scores.items()}
            reports.append(report)
            if on_round is not None:
                on_round(report)
        return reports

    def trained(self) -> VerticalModel:
        """The model as the parties hold it now, assembled in one copy."""
        return assemble(self.model, self.parties)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every party's weights, under the vertical model's names."""
        return self.trained().state_dict()


class LabelBoundaries:
    """What the label party's role reads of a split: the boundaries at its cuts (its
    front's embedding, and the top's output its head takes)."""

    def __init__(self, model: VerticalModel) -> None:
        first = (model.inputs[model.label_party],)
        self.boundaries = (first, model.head_boundary) if model.head_boundary else (first,)


def score_vertical(
    model: VerticalModel,
    inputs: Mapping[str, torch.Tensor],
    labels: torch.Tensor,
    *,
    batch_size: int = 256,
) -> dict[str, float]:
    """Loss, accuracy and ROC AUC of the whole vertical model on aligned ``inputs``."""
    outputs = []
    with eval_mode([model]), torch.no_grad():
        for start in range(0, len(labels), batch_size):
            part = {n: x[start : start + batch_size] for n, x in inputs.items()}
            outputs.append(model(part))
    logits = torch.cat(outputs) if outputs else torch.empty(0, 0)
    return classification_metrics(logits, labels)
