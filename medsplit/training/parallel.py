"""A round of parallel groups in one process (SplitFed, and any mode whose round plan puts
several hospitals in one group), with the secure aggregation performed for real.

Each turn of a group starts from the same state, has its own link, and either its own copy
of the server segment or a share of the job's single one, in the mode's
:meth:`~medsplit.modes.SplitMode.step_order`. Once the group ended, the hospitals'
segments are combined: by :class:`InProcessSecureAggregation` (every hospital's
:class:`~medsplit.secagg.HospitalRound` masks its state, an
:class:`~medsplit.secagg.Aggregator` sums the bytes, every hospital unmasks) when the mode
asks for it, else by the mode's :meth:`~medsplit.modes.SplitMode.combine_weighted`; the
server's copies by ``combine_weighted``, in the clear.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from medsplit.channel import Channel, RelayKeys
from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.errors import RoundPlanError
from medsplit.modes import GroupServer, SplitMode, StartFrom
from medsplit.modes.averaging import combine_counts, split_state
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, generate_identity_key
from medsplit.protocol.link import LocalLink
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, ServerRole, StepResult
from medsplit.secagg import (
    Aggregate,
    Aggregator,
    FixedPoint,
    HospitalRound,
    Peer,
    RoundId,
    SecAggError,
    VectorLayout,
)
from medsplit.training.aggregate_state import load_party_state, party_state
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import defended_role
from medsplit.training.schedule import Batch, turn_batches, turn_length


class Hospital(Protocol):
    """What a round needs of a hospital (``split_job.Hospital`` is one)."""

    name: str
    train: DataSplit


class RoundReport(Protocol):
    """What a round adds its steps to (``split_job.RoundReport`` is one)."""

    def add(self, result: StepResult) -> None: ...

    def add_transfer(self, *, up: int, down: int) -> None: ...


class SplitJob(Protocol):
    """What a round needs of the in-process job (``split_job.SplitJob`` is one; typed
    here so that this module does not import it back)."""

    mode: SplitMode
    config: TrainingConfig
    split: SplitModel
    channel: Channel
    loss_fn: LossFn | None
    initial_state: bytes
    client_state: bytes
    server_party: Party
    num_classes: int | None

    def _fresh_client_parties(self) -> dict[str, Party]: ...

    def _server_role(self, hospital: Hospital | None, party: Party | None = None) -> ServerRole: ...

    def secure_aggregation(self, hospitals: Sequence[str]) -> InProcessSecureAggregation: ...


def is_parallel(mode: SplitMode, hospitals: int) -> bool:
    """Whether an in-process job runs ``mode``'s parallel groups as such: the mode asks
    for it (:attr:`~medsplit.modes.SplitMode.parallel_in_process`) and its round plan
    puts several of ``hospitals`` in one group."""
    return mode.parallel_in_process and any(
        len(group) > 1 for group in mode.plan_round(list(range(hospitals)))
    )


@dataclass
class _Participant:
    identity: object
    recipient: RecipientKey
    signed: SignedRecipientKey


class InProcessSecureAggregation:
    """The hospitals of an in-process job with real keys, aggregating securely.

    Each has an ML-DSA-65 identity and a per-job recipient key signed by it, the others
    pin its identity; pair seeds and the group key are sealed and opened as on the
    platform, and the aggregator gets the masked submissions as bytes.

    Args:
        job: the job's id (every round is bound to it).
        hospitals: the participants' names.
        fixed: the ring's scale.
    """

    def __init__(self, job: str, hospitals: Sequence[str], fixed: FixedPoint | None = None):
        self.job = job
        self.hospitals = tuple(hospitals)
        self.fixed = fixed or FixedPoint()
        self._keys: dict[str, _Participant] = {}
        for name in hospitals:
            identity = generate_identity_key()
            recipient = RecipientKey.generate()
            signed = SignedRecipientKey.sign(
                job=job, hospital=name, key=recipient.public(), identity=identity
            )
            self._keys[name] = _Participant(identity, recipient, signed)
        #: The sizes of what crossed in the last round: submissions up, aggregate down.
        self.last_bytes_up = 0
        self.last_bytes_down = 0

    def average(
        self,
        round_: int,
        states: Mapping[str, Mapping[str, torch.Tensor]],
        weights: Mapping[str, int],
    ) -> dict[str, torch.Tensor]:
        """The weighted average of the hospitals' ``states`` (by name), through masking,
        summing and unmasking; integer buffers by their maximum, in the clear.

        Raises:
            SecAggError: the hospitals unmasked different averages, or a protocol check
                failed (as :mod:`medsplit.secagg` raises it).
        """
        rid = RoundId(self.job, round_, 0, dict(weights))
        parts = {name: split_state(states[name]) for name in rid.participants}
        layout = VectorLayout.of(parts[rid.participants[0]][0])
        sides = {
            me: HospitalRound(
                rid,
                me,
                identity=self._keys[me].identity,  # type: ignore[arg-type]
                recipient_key=self._keys[me].recipient,
                peers={
                    h: Peer(self._keys[h].identity.public_key(), self._keys[h].signed)  # type: ignore[attr-defined]
                    for h in rid.participants
                    if h != me
                },
                layout=layout,
                fixed=self.fixed,
            )
            for me in rid.participants
        }
        for side in sides.values():  # the relay carrying every sealed secret
            for secret in side.outgoing():
                sides[secret.recipient].accept(secret)
        aggregator = Aggregator(rid, layout.length)
        self.last_bytes_up = 0
        for me, side in sides.items():
            data = side.mask(parts[me][0]).to_bytes()
            self.last_bytes_up += len(data)
            aggregator.receive(data, hospital=me)
        down = aggregator.aggregate().to_bytes()
        self.last_bytes_down = len(down) * len(sides)
        averages = {me: side.unmask(Aggregate.from_bytes(down)) for me, side in sides.items()}
        first, *rest = rid.participants
        for me in rest:
            if any(not torch.equal(averages[me][k], averages[first][k]) for k in averages[first]):
                raise SecAggError(f"{me!r} and {first!r} unmasked different averages")
        averaged = averages[first]
        averaged.update(combine_counts([others for _, others in parts.values()]))
        some = states[first]
        return {k: averaged[k] for k in some}


@dataclass
class _Turn:
    index: int
    hospital: Hospital
    parties: dict[str, Party]
    client: ClientRole
    server_party: Party
    server: ServerRole
    link: LocalLink
    batches: Iterator[Batch]


def run_parallel_round(
    job: SplitJob,
    hospitals: Sequence[Hospital],
    round_: int,
    report: RoundReport,
    on_step: Callable[[StepResult], None] | None = None,
) -> None:
    """Every group of round ``round_`` of ``job``'s mode, its combination left in
    ``job.client_state`` (and ``job.server_party`` for per-turn server copies)."""
    mode, config = job.mode, job.config
    for group_index, group in enumerate(mode.plan_round(list(range(len(hospitals))))):
        kind = mode.start_from(round_, group_index)
        start = job.initial_state if kind == StartFrom.INITIAL else job.client_state
        shared = mode.group_server() == GroupServer.SHARED
        turns = []
        for index in group:
            hospital = hospitals[index]
            parties = job._fresh_client_parties()
            import_parties(start, parties)
            server_party = (
                job.server_party
                if shared
                else Party.create(copy.deepcopy(job.server_party.module), config.server_optimizer)
            )
            turns.append(
                _Turn(
                    index=index,
                    hospital=hospital,
                    parties=parties,
                    client=defended_role(
                        mode.client_role(
                            parties, job.split, codec=config.codec, loss_fn=job.loss_fn
                        ),
                        parties,
                        config,
                        records=len(hospital.train),
                        round_=round_,
                        classes=job.num_classes,
                    ),
                    server_party=server_party,
                    server=job._server_role(hospital, party=server_party),
                    link=LocalLink(job.channel, RelayKeys().streams(config.job, hospital.name)),
                    batches=turn_batches(config, hospital.train, round_=round_, hospital=index),
                )
            )
        lengths = [turn_length(config, len(t.hospital.train)) for t in turns]
        for position in mode.step_order(lengths, seed=config.seed, round_index=round_):
            turn = turns[position]
            batch = next(turn.batches, None)
            if batch is None:
                raise RoundPlanError(
                    f"{mode.name} step_order asked {turn.hospital.name!r} for more steps than "
                    f"its {lengths[position]}"
                )
            result = turn.link.run_step(turn.client, turn.server, batch.ids, batch.x, batch.y)
            report.add(result)
            if on_step is not None:
                on_step(result)
        left = [t.hospital.name for t in turns if next(t.batches, None) is not None]
        if left:
            raise RoundPlanError(f"{mode.name} step_order left steps of {left} untaken")
        weights = [len(t.hospital.train) for t in turns]
        states = [party_state(t.parties) for t in turns]
        if mode.secure_aggregation:
            secure = job.secure_aggregation([t.hospital.name for t in turns])
            combined = secure.average(
                round_,
                {t.hospital.name: s for t, s in zip(turns, states, strict=True)},
                {t.hospital.name: w for t, w in zip(turns, weights, strict=True)},
            )
            report.add_transfer(up=secure.last_bytes_up, down=secure.last_bytes_down)
        else:
            combined = mode.combine_weighted(states, weights)
        fresh = job._fresh_client_parties()
        load_party_state(fresh, combined)
        job.client_state = export_parties(fresh)
        if not shared:
            server_states = [t.server_party.module.state_dict() for t in turns]
            module = copy.deepcopy(job.server_party.module)
            module.load_state_dict(mode.combine_weighted(server_states, weights))
            job.server_party = Party.create(module, config.server_optimizer)
