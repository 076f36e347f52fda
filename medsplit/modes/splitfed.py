"""SplitFed: the hospitals train in parallel, their segments averaged every round.

Thapa et al., "SplitFed: When Federated Learning Meets Split Learning", AAAI 2022. One
parallel group per round; rounds after the first start from the average of the last
round's hospital segments (the front, and the head when the labels stay at home),
weighted by each hospital's number of training samples (public) in the fixed-point
arithmetic of :mod:`medsplit.secagg`, so that the average computed in the clear
(:meth:`SplitFedMode.combine_weighted`) equals, bit for bit, what secure aggregation
yields. The hospitals' segments are combined by secure aggregation only
(:attr:`SplitFedMode.secure_aggregation`); the server's copies are averaged in the clear
at the server, as in the paper.

Options: ``variant`` ``v1`` (SFLV1: each hospital its own copy of the server segment,
averaged like the fronts) or ``v2`` (SFLV2: one server segment serving every hospital's
steps in a seeded interleaving, :meth:`SplitFedMode.step_order`); ``labels`` ``server``
(vanilla placement, one cut) or ``hospital`` (U-shaped placement, two cuts).

The platform runs both variants: the agents submit masked segments through the relay to a
worker aggregator (docs/protocol.md, "Secure aggregation on the platform"); SFLV2's round
is one worker task on one shared server segment (``workers/group_runner.py``). In
process, :class:`medsplit.training.split_job.SplitJob` runs both with the secure
aggregation performed for real.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from medsplit.cutting import SplitModel
from medsplit.errors import ConfigError, RoundPlanError
from medsplit.modes.averaging import weighted_average
from medsplit.modes.base import GroupServer, ModeOption, Side, SplitMode, StartFrom
from medsplit.modes.ushaped import UShapedMode
from medsplit.modes.vanilla import VanillaMode
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, ServerRole
from medsplit.wire import Frame

NAME = "splitfed"
V1, V2 = "v1", "v2"

VARIANT = ModeOption(
    "variant",
    str,
    V1,
    "v1: one server segment per hospital, averaged each round; v2: one shared server "
    "segment, the hospitals' steps in a seeded interleaving",
    choices=(V1, V2),
)
LABELS_OPTION = ModeOption(
    "labels",
    str,
    Side.SERVER.value,
    "server: the server holds the labels (vanilla); hospital: the hospital keeps the head "
    "and the labels (U-shaped), and the heads are averaged like the fronts",
    choices=(Side.SERVER.value, Side.HOSPITAL.value),
)

_VANILLA = VanillaMode()
_USHAPED = UShapedMode()


class SplitFedMode(SplitMode):
    """Every hospital at once; their segments averaged by secure aggregation each round.

    Args:
        variant: ``v1`` or ``v2`` (see the module).
        labels: ``server`` or ``hospital``: where the labels and the loss are.

    Raises:
        ConfigError: an unknown variant or label placement.
    """

    name = NAME
    title = "SplitFed"
    summary = (
        "every hospital trains at once; their segments are averaged each round by secure "
        "aggregation, weighted by samples"
    )
    # The class's defaults (variant v1, labels at the server); an instance bound to a
    # job's options (with_options) may have two cuts and the labels at the hospital.
    cuts = 1
    labels = Side.SERVER
    server_segment = 1
    secure_aggregation = True
    parallel_in_process = True

    def __init__(self, variant: str = V1, labels: str = Side.SERVER.value) -> None:
        for option, value in ((VARIANT, variant), (LABELS_OPTION, labels)):
            problem = option.problem(value)
            if problem is not None:
                raise ConfigError(f"{NAME} mode: {problem}")
        self.variant = variant
        self.label_side = Side(labels)
        self._base: SplitMode = _USHAPED if self.label_side == Side.HOSPITAL else _VANILLA
        self.cuts = self._base.cuts  # type: ignore[misc]
        self.labels = self._base.labels  # type: ignore[misc]

    # -- options -----------------------------------------------------------------------

    def options(self) -> tuple[ModeOption, ...]:
        return (VARIANT, LABELS_OPTION)

    def configuration_title(self) -> str:
        where = "labels at home" if self.label_side == Side.HOSPITAL else "labels at the server"
        return f"SplitFed ({'SFLV1' if self.variant == V1 else 'SFLV2'}, {where})"

    def with_options(self, values: Mapping[str, Any]) -> SplitFedMode:
        filled = self.check_options(values)
        if (filled["variant"], filled["labels"]) == (self.variant, self.label_side.value):
            return self
        return SplitFedMode(filled["variant"], filled["labels"])

    # -- parties and the step (those of vanilla or U-shaped, under this mode's name) ----

    def client_segments(self) -> dict[str, int]:
        return self._base.client_segments()

    def client_role(
        self,
        parties: Mapping[str, Party],
        split: SplitModel,
        *,
        codec: str = "none",
        loss_fn: LossFn | None = None,
    ) -> ClientRole:
        # The base mode's own hook, run on this mode: its roles then carry this mode's name
        # (a role writes the name of the mode that built it), and no role is written twice.
        build = type(self._base).client_role
        return build(self, parties, split, codec=codec, loss_fn=loss_fn)  # type: ignore[arg-type]

    def server_role(
        self,
        party: Party,
        split: SplitModel,
        *,
        job: str,
        codec: str = "none",
        loss_fn: LossFn | None = None,
        limits: FrameLimits | None = None,
    ) -> ServerRole:
        build = type(self._base).server_role  # as in client_role
        return build(  # type: ignore[arg-type]
            self, party, split, job=job, codec=codec, loss_fn=loss_fn, limits=limits
        )

    def eval_logits(
        self,
        frame: Frame,
        *,
        parties: Mapping[str, Party],
        split: SplitModel,
        samples: int,
        limits: FrameLimits,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        return self._base.eval_logits(
            frame, parties=parties, split=split, samples=samples, limits=limits, device=device
        )

    # -- the round ---------------------------------------------------------------------

    def plan_round(self, participants: Sequence[Any]) -> list[tuple[Any, ...]]:
        """One parallel group: every hospital at once."""
        return [tuple(participants)]

    def start_from(self, round_index: int, group_index: int) -> StartFrom:
        if group_index != 0:
            raise RoundPlanError(f"{NAME} rounds have one group, asked for {group_index}")
        return StartFrom.INITIAL if round_index == 0 else StartFrom.AGGREGATE

    def group_server(self) -> GroupServer:
        return GroupServer.PER_TURN if self.variant == V1 else GroupServer.SHARED

    def step_order(self, lengths: Sequence[int], *, seed: int, round_index: int) -> list[int]:
        """SFLV1: each hospital's steps in turn (separate server copies: the order changes
        nothing). SFLV2: a permutation of all the group's steps drawn from the job's seed
        and the round; each hospital's own steps keep their order."""
        steps = super().step_order(lengths, seed=seed, round_index=round_index)
        if self.variant == V1:
            return steps
        generator = torch.Generator().manual_seed(interleaving_seed(seed, round_index))
        return [steps[i] for i in torch.randperm(len(steps), generator=generator).tolist()]

    def combine(self, states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Equal weights (one each): :meth:`combine_weighted` says how."""
        return self.combine_weighted(states, [1] * len(states))

    def combine_weighted(
        self, states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """The weighted average in the ring Z/2^64 (:func:`weighted_average`): what secure
        aggregation of the same states yields, bit for bit."""
        return weighted_average(states, weights)


def interleaving_seed(seed: int, round_index: int) -> int:
    """The seed of SFLV2's interleaving in round ``round_index`` of a job seeded ``seed``."""
    digest = hashlib.sha256(f"{NAME}-v2-interleaving:{seed}:{round_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
