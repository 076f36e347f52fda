"""The interface every split-learning mode implements: one class, a few documented hooks.

Modelled on Flower's ``Strategy``: the callers (the in-process job, the two sides of a
turn, the CLI, the coordinator's validation and API) hold a :class:`SplitMode` and call
its hooks; none of them branches on which mode it is. A mode is one file under
``medsplit/modes/`` holding its class and its step roles, registered in
:mod:`medsplit.modes.registry`.

Hooks in use: :meth:`SplitMode.client_segments`, :meth:`SplitMode.default_cuts`,
:meth:`SplitMode.check_cuts`, :meth:`SplitMode.client_role`,
:meth:`SplitMode.server_role`, :meth:`SplitMode.eval_activations`,
:meth:`SplitMode.eval_outputs`, :meth:`SplitMode.eval_logits`, :meth:`SplitMode.options`
and :meth:`SplitMode.describe`; and the round's, with round-robin defaults, which the
coordinator's scheduler, the worker's turn runner and the agent call:
:meth:`SplitMode.plan_round` (the groups of a round), :meth:`SplitMode.start_from`
(where a group's turns start), :meth:`SplitMode.result_from` (where the job's final
weights come from) and :meth:`SplitMode.combine` (through
:meth:`SplitMode.combine_exported`, the state made of the last group's).

Hooks added for parallel modes (SplitFed): :meth:`SplitMode.with_options` (the mode
bound to a job's option values, which may change its cuts and labels),
:meth:`SplitMode.check_options`, :meth:`SplitMode.combine_weighted` (``combine`` with the
hospitals' public sample counts; by default it ignores them and calls ``combine``),
:meth:`SplitMode.group_server` and :meth:`SplitMode.step_order` (how one parallel group
shares the server segment), :attr:`SplitMode.secure_aggregation` (the hospitals'
segments are combined by secure aggregation, :mod:`medsplit.secagg`) and
:attr:`SplitMode.runs_on_platform` (whether the coordinator may accept its jobs yet).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from medsplit.cutting import BoundaryTensor, SplitModel
from medsplit.errors import ConfigError, RoundPlanError
from medsplit.models import ModelSpec
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.protocol.roles import (
    LOGITS,
    ClientRole,
    LossFn,
    ServerRole,
    boundary_spec,
    eval_mode,
)
from medsplit.wire import Frame, FrameKind, FrameSpec

#: The most option combinations a mode lists as configurations (a form's choices).
MAX_CONFIGURATIONS = 16
#: The name of the server's party, wherever parties are listed by name.
SERVER_PARTY = "server"

P = TypeVar("P")


class Side(StrEnum):
    """A side of the split: who holds the labels and computes the loss, say."""

    SERVER = "server"
    HOSPITAL = "hospital"


class GroupServer(StrEnum):
    """How the turns of one parallel group share the server segment."""

    PER_TURN = "per_turn"  # each turn its own copy, combined once the group ended
    SHARED = "shared"  # one segment serving every turn's steps in the mode's step_order
    JOINT = "joint"  # one segment, each step joining every turn's frame (vertical)


class StartFrom(StrEnum):
    """Where a turn's client state comes from."""

    PREVIOUS = "previous"  # the hand-off of the hospital that took the turn before
    INITIAL = "initial"  # the job's initial weights (the halves of the seeded model)
    AGGREGATE = "aggregate"  # what :meth:`SplitMode.combine` made of the last group
    OWN = "own"  # this hospital's own last turn: its segments never leave it (vertical)


@dataclass(frozen=True)
class ModeOption:
    """One setting a mode takes beyond the job's common ones.

    Attributes:
        name: the option's key in a job's configuration (``[a-z][a-z0-9_]*``).
        type: ``int``, ``float``, ``str`` or ``bool``.
        default: the value a job gets when it does not say; of ``type``.
        help: one line for the people filling in a job.
        choices: the values it may take (any of its type when empty).
        minimum: the smallest value an ``int`` or ``float`` option may take (``None``: no
            bound).
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: int | float | None = None

    def __post_init__(self) -> None:
        if self.type not in (int, float, str, bool):
            raise ConfigError(
                f"option {self.name!r}: type must be int, float, str or bool, got {self.type!r}"
            )
        # bool is an int; a bool default of an int option is a mistake all the same.
        wrong = isinstance(self.default, bool) != (self.type is bool)
        if wrong or not isinstance(self.default, self.type):
            raise ConfigError(
                f"option {self.name!r}: default {self.default!r} is not a {self.type.__name__}"
            )
        if self.choices and self.default not in self.choices:
            raise ConfigError(
                f"option {self.name!r}: default {self.default!r} is not one of {list(self.choices)}"
            )
        if self.minimum is not None and (
            self.type not in (int, float) or self.default < self.minimum
        ):
            raise ConfigError(
                f"option {self.name!r}: a minimum needs an int or float option whose default "
                f"is at least it, got {self.default!r} and minimum {self.minimum!r}"
            )

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a value of this option, in words; ``None`` if it is."""
        # A bool is an int, but not an int option's value; an int is a fine float.
        fits = isinstance(value, bool) == (self.type is bool) and (
            isinstance(value, self.type)
            or (self.type is float and isinstance(value, int) and not isinstance(value, bool))
        )
        if not fits:
            return f"{self.name} must be a {self.type.__name__}, got {value!r}"
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {list(self.choices)}, got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"{self.name} must be at least {self.minimum}, got {value!r}"
        return None

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "type": self.type.__name__,
            "default": self.default,
            "help": self.help,
        }
        if self.choices:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        return out


@dataclass(frozen=True)
class SegmentRole:
    """Who runs one segment of the cut model: its index, its party's name and its side."""

    index: int
    party: str
    side: Side

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "party": self.party, "side": self.side.value}


@dataclass(frozen=True)
class ModeDescription:
    """What a mode is, for people and for the forms and checks built from it
    (``GET /api/modes/``, the CLI's ``--mode``)."""

    name: str
    title: str
    summary: str
    cuts: int
    labels: Side
    segments: tuple[SegmentRole, ...]
    options: tuple[ModeOption, ...] = field(default=())
    runs_on_platform: bool = True
    configurations: tuple[ModeConfiguration, ...] = field(default=())
    feature_sets: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "summary": self.summary,
            "cuts": self.cuts,
            "labels": self.labels.value,
            "segments": [s.to_json() for s in self.segments],
            "options": [o.to_json() for o in self.options],
            "runs_on_platform": self.runs_on_platform,
            "configurations": [c.to_json() for c in self.configurations],
            "feature_sets": self.feature_sets,
        }


@dataclass(frozen=True)
class ModeConfiguration:
    """The mode bound to one choice of each of its options (:meth:`SplitMode.with_options`):
    what its cuts, labels and segments then are, and whether the platform runs it; what a
    form offers as one choice."""

    options: Mapping[str, Any]
    title: str
    cuts: int
    labels: Side
    segments: tuple[SegmentRole, ...]
    runs_on_platform: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "options": dict(self.options),
            "title": self.title,
            "cuts": self.cuts,
            "labels": self.labels.value,
            "segments": [s.to_json() for s in self.segments],
            "runs_on_platform": self.runs_on_platform,
        }


class JointServerRole(Protocol):
    """The server's step over every party's frame of one step (vertical split learning):
    :meth:`forward` takes each party's frame and answers those the step answers now;
    :meth:`backward` takes the label party's gradient at the head, where there is one."""

    parties: list[str]

    def expect(self, party: str) -> FrameSpec: ...

    def forward(self, frames: Mapping[str, Frame]) -> dict[str, Frame]: ...

    def backward(self, frame: Frame) -> dict[str, Frame]: ...


class SplitMode(ABC):
    """One way of splitting a network between hospitals and the server.

    A subclass sets the class attributes and implements the abstract hooks; the others
    have defaults that suit a round-robin mode with one server segment.

    Attributes:
        name: the mode's name on the wire, in the database and in the API
            (:data:`medsplit.wire.frame.MODE_NAME_RE`).
        title: a short name for people.
        summary: one line saying who holds what.
        cuts: how many cuts the network gets (one more segment than that).
        labels: which side holds the labels and computes the loss.
        server_segment: the index of the segment the server trains.
        feature_sets: whether participants hold different features of the same
            patients, each naming its feature set (vertical split learning).
        secure_aggregation: a parallel group's hospital segments are combined by secure
            aggregation (:mod:`medsplit.secagg`), never seen in the clear by the server.
        hands_on: a hospital's segments go to the hospitals after it (sealed hand-offs);
            without it each keeps its own between rounds and seals nothing (vertical:
            every party its own front, which no other party may see).
        runs_on_platform: the coordinator may accept this mode's jobs (``False`` while
            the platform lacks what the mode needs, e.g. secure aggregation).
        parallel_in_process: the in-process job (``SplitJob``) runs the round plan's
            parallel groups with :meth:`group_server`, :meth:`step_order` and
            :meth:`combine_weighted`; without it, it runs every hospital's turn
            round-robin, as it always did (the platform follows the plan either way).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str]
    cuts: ClassVar[int]
    labels: ClassVar[Side]
    server_segment: ClassVar[int] = 1
    feature_sets: ClassVar[bool] = False
    secure_aggregation: ClassVar[bool] = False
    hands_on: ClassVar[bool] = True
    runs_on_platform: ClassVar[bool] = True
    parallel_in_process: ClassVar[bool] = False
    #: Whether SplitGuard's fake-label probes fit: the labels travel with the activations
    #: to one server holding the rest of the model, every step its own (vanilla only).
    label_probes: ClassVar[bool] = False

    # -- parties and segments ------------------------------------------------------------

    @abstractmethod
    def client_segments(self) -> dict[str, int]:
        """The segments a hospital holds, by party name (what it hands on after a turn)."""

    def segments(self) -> tuple[SegmentRole, ...]:
        """Every segment with who runs it, in forward order."""
        roles = [SegmentRole(i, n, Side.HOSPITAL) for n, i in self.client_segments().items()]
        roles.append(SegmentRole(self.server_segment, SERVER_PARTY, Side.SERVER))
        return tuple(sorted(roles, key=lambda r: r.index))

    def default_cuts(self, spec: ModelSpec) -> tuple[str, ...]:
        """Where ``spec``'s model is cut in this mode when a job does not say."""
        return spec.default_cuts(self.cuts)

    def check_cuts(self, cuts: str | Sequence[str]) -> tuple[str, ...]:
        """``cuts`` as a tuple, once their number suits the mode (a single name is one cut).

        Raises:
            ConfigError: the wrong number of cuts, naming how many the mode needs.
        """
        cuts = (cuts,) if isinstance(cuts, str) else tuple(cuts)
        if len(cuts) != self.cuts:
            raise ConfigError(self.cut_count_problem(cuts))
        return cuts

    def cut_count_problem(self, cuts: Sequence[str]) -> str:
        """Why ``cuts`` are the wrong number for this mode, in words."""
        return f"{self.name} mode needs {self.cuts} cut(s), got {len(cuts)}: {list(cuts)}"

    # -- the step ------------------------------------------------------------------------

    @abstractmethod
    def client_role(
        self,
        parties: Mapping[str, Party],
        split: SplitModel,
        *,
        codec: str = "none",
        loss_fn: LossFn | None = None,
    ) -> ClientRole:
        """The hospital's step role over its parties (those of :meth:`client_segments`)."""

    @abstractmethod
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
        """The server's step role over its party; ``limits`` bound what frames may hold."""

    # -- parties holding different features of the same records (vertical) ------------

    def embedding_join(self) -> str | None:
        """How the server joins every party's embedding of one step
        (:mod:`medsplit.modes.joins`), for a mode whose parties hold different features
        of the same records (:attr:`feature_sets`); ``None``: one party per step."""
        return None

    def passive_role(
        self, front: Party, boundary: Sequence[BoundaryTensor], *, codec: str = "none"
    ) -> ClientRole:
        """The step role of a party that holds features but no labels (vertical).

        Raises:
            ConfigError: by default: every party of this mode holds labels.
        """
        raise ConfigError(f"{self.name} mode has no party without labels")

    def joint_server_role(
        self,
        top: Party,
        *,
        inputs: Mapping[str, BoundaryTensor],
        top_input: str,
        head_boundary: Sequence[BoundaryTensor] | None,
        label_party: str,
        job: str,
        codec: str = "none",
        loss_fn: LossFn | None = None,
        limits: FrameLimits | None = None,
    ) -> JointServerRole:
        """The server's step over every party's frame of one step (vertical): ``inputs``
        is the one tensor each party's front sends, ``top_input`` the name the top
        segment takes the joined tensor under, ``head_boundary`` what the top sends the
        label party's head (with the labels at home).

        Raises:
            ConfigError: by default: this mode's steps have one party each.
        """
        raise ConfigError(f"{self.name} mode's steps come from one party each")

    def eval_activations(
        self, parties: Mapping[str, Party], x: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """How validation starts at the hospital: what its first segment makes of one
        validation batch ``x``, in eval mode and without gradients (learning nothing), to
        cross in an ``eval_activations`` frame. Default: the ``front`` party's outputs."""
        front = parties["front"].module
        with eval_mode([front]), torch.no_grad():
            return dict(front(x))

    def eval_outputs(
        self, frame: Frame, *, party: Party, split: SplitModel, limits: FrameLimits
    ) -> dict[str, torch.Tensor]:
        """How validation crosses the server: its segment's outputs for an
        ``eval_activations`` frame, checked first (the step, the tensors of the first cut,
        the batch, finite values), computed in eval mode without gradients, and checked
        again; a segment that ends the model answers ``logits``. Default: one server
        segment after the first cut.

        Raises:
            FrameRejected: a check failed; nothing was learnt.
        """
        spec = FrameSpec(
            kind=FrameKind.EVAL_ACTIVATIONS, tensors=boundary_spec(split.boundaries[0])
        )
        index = checks.check_eval_step(frame, limits)
        checks.conforms(frame, spec)
        checks.check_eval_batch(frame, checks.batch_of(frame), limits, index)
        checks.check_finite(frame)
        module = party.module
        with eval_mode([module]), torch.no_grad():
            out = module(**dict(frame.tensors))
        tensors = dict(out) if isinstance(out, Mapping) else {LOGITS: out}
        checks.check_computed(frame, {f"output {n!r}": t for n, t in tensors.items()})
        return tensors

    @abstractmethod
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
        """How validation crosses the cut back: the logits of one validation batch of
        ``samples`` from the server's ``eval_outputs`` frame, checked (raising
        :class:`~medsplit.protocol.checks.FrameRejected`) before anything runs on it.
        ``device`` is where the hospital's parties are."""

    # -- the round ---------------------------------------------------------------------

    def plan_round(self, participants: Sequence[P]) -> list[tuple[P, ...]]:
        """The round's groups, in order: the turns of one group run at the same time, a
        group starts once the one before it ended. Default: one hospital per group, in
        the participants' order (round-robin)."""
        return [(p,) for p in participants]

    def start_from(self, round_index: int, group_index: int) -> StartFrom:
        """Where the turns of a group start. Default (round-robin): the job's initial
        weights for the very first turn, the previous hospital's hand-off after that."""
        if round_index == 0 and group_index == 0:
            return StartFrom.INITIAL
        return StartFrom.PREVIOUS

    def result_from(self, rounds: int) -> StartFrom:
        """Where a job's result (its final weights) comes from once its ``rounds`` rounds
        ended: what a further round would start from. Round-robin: the last turn's
        hand-off; a mode that combines its groups: the combination of the last group, so
        that every hospital and the server keep the same, combined, model."""
        kind = self.start_from(rounds, 0)
        return StartFrom.PREVIOUS if kind == StartFrom.INITIAL else kind

    def combine(self, states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The state the next group starts from, made of the states a group ended with
        (each a state dict of the client parties). Round-robin never combines.

        Raises:
            RoundPlanError: by default: a group of one hands its state on as it is.
        """
        raise RoundPlanError(
            f"{self.name} mode hands each hospital's state to the next one and never "
            f"combines states (asked to combine {len(states)}); a mode whose plan_round "
            "puts several hospitals in one group overrides combine()"
        )

    def combine_weighted(
        self, states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """:meth:`combine` given each state's public weight (its hospital's number of
        training samples). Default: the weights are not used, :meth:`combine` decides."""
        return self.combine(states)

    def group_server(self) -> GroupServer:
        """How a parallel group's turns share the server segment (default: each turn its
        own copy, combined by :meth:`combine_weighted` once the group ended)."""
        return GroupServer.PER_TURN

    def step_order(self, lengths: Sequence[int], *, seed: int, round_index: int) -> list[int]:
        """The order in which one parallel group's steps reach the server: a position in
        the group per step, position ``i`` appearing ``lengths[i]`` times. Default: each
        turn's steps one after the other (what separate server copies see anyway)."""
        return [i for i, n in enumerate(lengths) for _ in range(n)]

    def combine_exported(
        self,
        blobs: Sequence[bytes],
        fresh: Callable[[], Mapping[str, Party]],
        weights: Sequence[int] | None = None,
    ) -> bytes:
        """The state a turn starts from when it starts from the combination of the last
        group (:attr:`StartFrom.AGGREGATE`): each of ``blobs`` (exported parties: the
        hospitals' hand-offs, or the server's checkpoints) loaded into ``fresh()``
        parties, their weights, keyed ``"<party>.<name>"``, combined by :meth:`combine`
        and set into fresh parties again, exported. Their optimizers start afresh: a
        combined state begins a new optimisation, as in federated averaging. With
        ``weights`` (one per blob), :meth:`combine_weighted` combines them.

        Raises:
            HandoffError: a blob is not an export of such parties.
            RoundPlanError: this mode does not combine (see :meth:`combine`).
        """
        states = []
        for blob in blobs:
            parties = fresh()
            import_parties(blob, parties)
            states.append(
                {
                    f"{name}.{key}": value
                    for name, party in parties.items()
                    for key, value in party.module.state_dict().items()
                }
            )
        combined = (
            self.combine(states) if weights is None else self.combine_weighted(states, weights)
        )
        parties = fresh()
        for name, party in parties.items():
            own = {k[len(name) + 1 :]: v for k, v in combined.items() if k.startswith(f"{name}.")}
            party.module.load_state_dict(own)
        return export_parties(parties)

    def handoff_topic(self, round_index: int, participants: int) -> str:
        """The relay topic of a hand-off sealed after a turn of round ``round_index``.

        Round-robin keeps one slot per sender and recipient (``handoff``): a hospital
        hands on again only after every later turn read what it left. Where the plan puts
        several hospitals in one group, a sibling may end its next turn before this
        hospital read the sibling's last hand-off, so odd rounds use a second slot
        (``handoff-odd``); a round's blobs are overwritten two rounds on, once all read.
        """
        groups = self.plan_round(list(range(participants)))
        if all(len(group) == 1 for group in groups) or round_index % 2 == 0:
            return "handoff"
        return "handoff-odd"

    # -- what it is --------------------------------------------------------------------

    def options(self) -> tuple[ModeOption, ...]:
        """The settings this mode takes beyond the job's common ones (none by default)."""
        return ()

    def check_options(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        """``values`` checked against :meth:`options`, every option's default filled in.

        Raises:
            ConfigError: an option this mode does not take, or a value that does not fit.
        """
        values = dict(values or {})
        options = {o.name: o for o in self.options()}
        problems = [
            f"{self.name} mode has no option {key!r} (it takes {', '.join(options) or 'none'})"
            for key in values
            if key not in options
        ]
        filled = {name: values.get(name, o.default) for name, o in options.items()}
        problems += [p for n, o in options.items() if (p := o.problem(filled[n])) is not None]
        if problems:
            raise ConfigError("; ".join(problems))
        return filled

    def with_options(self, values: Mapping[str, Any]) -> SplitMode:
        """This mode as a job with these option values (checked, defaults filled) runs it.
        Default: the options change nothing the interface asks, so the mode itself."""
        self.check_options(values)
        return self

    def configuration_title(self) -> str:
        """How a form names this mode bound to its options. Default: the title."""
        return self.title

    def configurations(self) -> tuple[ModeConfiguration, ...]:
        """The mode under every combination of the choices of its options that have
        choices (at most :data:`MAX_CONFIGURATIONS` combinations; the other options at
        their defaults), in the options' order; else none (a form then offers the mode
        with its defaults only)."""
        options = tuple(o for o in self.options() if o.choices)
        if not options:
            return ()
        combinations = list(itertools.product(*(o.choices for o in options)))
        if len(combinations) > MAX_CONFIGURATIONS:
            return ()
        out = []
        for values in combinations:
            chosen = dict(zip((o.name for o in options), values, strict=True))
            bound = self.with_options(chosen)
            out.append(
                ModeConfiguration(
                    options=chosen,
                    title=bound.configuration_title(),
                    cuts=bound.cuts,
                    labels=bound.labels,
                    segments=bound.segments(),
                    runs_on_platform=bound.runs_on_platform,
                )
            )
        return tuple(out)

    def describe(self) -> ModeDescription:
        """The mode as the API, the dashboard and the CLI show it."""
        return ModeDescription(
            name=self.name,
            title=self.title,
            summary=self.summary,
            cuts=self.cuts,
            labels=self.labels,
            segments=self.segments(),
            options=self.options(),
            runs_on_platform=self.runs_on_platform,
            configurations=self.configurations(),
            feature_sets=self.feature_sets,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
