"""Run a whole split-learning job in one process: hospitals take turns round-robin.

Every frame still goes through a real channel as encoded bytes, and every hand-off
between hospitals goes through safetensors bytes, so what this runs is what the
distributed platform runs, minus the network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from medsplit.channel import Channel, InMemoryChannel, RelayKeys
from medsplit.cutting import SplitModel, split_model
from medsplit.cutting.split import SEGMENT_NAMES
from medsplit.data import DataSplit
from medsplit.errors import CutError
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.link import LocalLink
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn, ServerRole, StepResult
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import defended_role
from medsplit.training.evaluate import Evaluation, eval_mode, evaluate
from medsplit.training.parallel import (
    InProcessSecureAggregation,
    is_parallel,
    run_parallel_round,
)
from medsplit.training.schedule import turn_batches, turn_limits
from medsplit.training.setup import client_parties
from medsplit.training.tasks import DEFAULT_TASK, check_model_output, label_shape


@dataclass(frozen=True)
class Hospital:
    """A participant of an in-process job: a name and its local data (never shared)."""

    name: str
    train: DataSplit
    val: DataSplit | None = None


@dataclass
class RoundReport:
    """What one round did: every hospital's turn, summed."""

    round: int
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    validation: dict[str, Evaluation] = field(default_factory=dict)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.steps if self.steps else float("nan")

    def add_transfer(self, *, up: int, down: int) -> None:
        """Bytes that crossed outside the steps (SplitFed's masked submissions up, the
        aggregate down to each hospital)."""
        self.bytes_up += up
        self.bytes_down += down

    def add(self, result: StepResult) -> None:
        self.steps += 1
        self.samples += result.samples
        self.loss_sum += result.loss
        self.bytes_up += result.bytes_up
        self.bytes_down += result.bytes_down


StepCallback = Callable[[StepResult], None]


class SplitJob:
    """A split-learning job over in-process hospitals.

    Args:
        model: the whole model, initialised as the job starts (it is not modified).
        example_input: a batch-first example input, for cutting.
        config: the training settings; ``config.cuts`` says where to cut.
        channel: the channel frames travel on (a fresh in-memory one by default).
        loss_fn: loss on (logits, labels); by default the config's task's
            (:meth:`TrainingConfig.loss_fn`: cross-entropy for classification).
        num_classes: the classes labels must fall in (by default the width of the
            model's output on ``example_input``).

    Raises:
        ConfigError: the model's output does not fit the config's task (a segmentation
            job needs ``(N, classes, *spatial)`` logits).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        example_input: torch.Tensor,
        config: TrainingConfig,
        *,
        channel: Channel | None = None,
        loss_fn: LossFn | None = None,
        num_classes: int | None = None,
    ):
        self.config = config
        self.mode = config.split_mode
        self.split: SplitModel = split_model(model, example_input, config.cuts)
        _check_every_segment_trains(self.split)
        self.channel = channel or InMemoryChannel()
        self.loss_fn = loss_fn or config.loss_fn()
        # One forward in eval mode changes nothing (no gradients, no batch statistics).
        with eval_mode(list(self.split.segments)), torch.no_grad():
            out = self.split.forward(example_input)
        width = int(out.shape[1]) if isinstance(out, torch.Tensor) and out.dim() >= 2 else None
        self.num_classes = num_classes if num_classes is not None else width
        if width is not None:
            # A classifier's width is its classes (labels are checked against them).
            classes = self.num_classes if config.task != DEFAULT_TASK else width
            shape = tuple(example_input.shape[1:])
            check_model_output(config.task, out, input_shape=shape, num_classes=classes or -1)
        #: One sample's training target (a class index, or a mask of the input's shape).
        self.label_shape = label_shape(config.task, tuple(example_input.shape[1:]))
        self.server_party = Party.create(
            self.split.segments[self.mode.server_segment], config.server_optimizer
        )
        self.server = self._server_role(None)
        # The first hospital starts from the model's own initial weights.
        self.client_state: bytes = export_parties(self._fresh_client_parties())
        self.initial_state: bytes = self.client_state
        self._secure: InProcessSecureAggregation | None = None

    def secure_aggregation(self, hospitals: Sequence[str]) -> InProcessSecureAggregation:
        """The in-process secure aggregation of ``hospitals`` (their keys made once)."""
        if self._secure is None or set(self._secure.hospitals) != set(hospitals):
            self._secure = InProcessSecureAggregation(self.config.job, hospitals)
        return self._secure

    def _server_role(self, hospital: Hospital | None, party: Party | None = None) -> ServerRole:
        """The server's role for one hospital's turn, held to what that turn may send."""
        limits = None
        if hospital is not None:
            val = len(hospital.val) if hospital.val is not None else 0
            limits = turn_limits(
                self.config,
                num_classes=self.num_classes,
                train=len(hospital.train),
                val=val,
                label_shape=self.label_shape,
            )
        return self.mode.server_role(
            party or self.server_party,
            self.split,
            job=self.config.job,
            codec=self.config.codec,
            loss_fn=self.loss_fn,
            limits=limits,
        )

    def _fresh_client_parties(self) -> dict[str, Party]:
        # Each turn gets its own copy of the client segments, so the only way weights
        # reach the next hospital is through the hand-off bytes.
        return client_parties(self.split, self.config)

    def client_parties(self) -> dict[str, Party]:
        """The client parties as the last hand-off left them."""
        parties = self._fresh_client_parties()
        import_parties(self.client_state, parties)
        return parties

    def run_turn(
        self, hospital: Hospital, *, index: int, round_: int, on_step: StepCallback | None = None
    ) -> list[StepResult]:
        """One hospital's turn: take the hand-off, train over local data, hand off."""
        parties = self.client_parties()
        client = defended_role(
            self.mode.client_role(
                parties, self.split, codec=self.config.codec, loss_fn=self.loss_fn
            ),
            parties,
            self.config,
            records=len(hospital.train),
            round_=round_,
            classes=self.num_classes,
        )
        link = LocalLink(self.channel, RelayKeys().streams(self.config.job, hospital.name))
        self.server = self._server_role(hospital)
        results = []
        for batch in turn_batches(self.config, hospital.train, round_=round_, hospital=index):
            result = link.run_step(client, self.server, batch.ids, batch.x, batch.y)
            results.append(result)
            if on_step is not None:
                on_step(result)
        self.client_state = export_parties(parties)
        return results

    def run(
        self,
        hospitals: Sequence[Hospital],
        *,
        on_step: StepCallback | None = None,
        on_round: Callable[[RoundReport], None] | None = None,
    ) -> list[RoundReport]:
        """All rounds; after each, every hospital validates the current model locally.

        A mode whose round plan runs hospitals in parallel (SplitFed) runs its rounds
        through :func:`~medsplit.training.parallel.run_parallel_round`; the others take
        turns round-robin."""
        reports = []
        parallel = is_parallel(self.mode, len(hospitals))
        for round_ in range(self.config.rounds):
            report = RoundReport(round_)
            if parallel:
                run_parallel_round(self, hospitals, round_, report, on_step)
            for index, hospital in enumerate(() if parallel else hospitals):
                for result in self.run_turn(hospital, index=index, round_=round_, on_step=on_step):
                    report.add(result)
            segments = self.segments()
            for hospital in hospitals:
                if hospital.val is not None and len(hospital.val):
                    report.validation[hospital.name] = evaluate(
                        segments, hospital.val, task=self.config.task, loss_fn=self.loss_fn
                    )
            reports.append(report)
            if on_round is not None:
                on_round(report)
        return reports

    def segments(self) -> list[torch.nn.Module]:
        """The current segments in forward order (client ones from the last hand-off)."""
        parties = self.client_parties()
        by_index = {
            index: parties[name].module for name, index in self.mode.client_segments().items()
        }
        by_index[self.mode.server_segment] = self.server_party.module
        return [by_index[i] for i in sorted(by_index)]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained model's weights under the original parameter names."""
        merged: dict[str, torch.Tensor] = {}
        for segment in self.segments():
            merged.update(segment.state_dict())
        return merged


def _check_every_segment_trains(split: SplitModel) -> None:
    """Each party needs weights: an optimizer over nothing is a configuration mistake."""
    labels = SEGMENT_NAMES[len(split.segments)]
    for index, segment in enumerate(split.segments):
        if not any(True for _ in segment.parameters()):
            where = " / ".join(split.cuts)
            raise CutError(
                f"the {labels[index]} segment of cut {where!r} holds no parameters, so that "
                "party would have nothing to train; choose a cut with layers on every side "
                "(see `medsplit cuts MODEL`)"
            )
