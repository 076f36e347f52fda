"""Vertical split learning: parties hold different features of the same patients.

Vepakomma et al., "Split learning for health: distributed deep learning without sharing
raw patient data", 2018, the vertically partitioned configuration. Every party runs its
own front on its own features of the same records, in the same order (aligned by private
set intersection, :mod:`medsplit.psi`); the server joins their embeddings (sum, mean or
concatenation: the ``join`` option) and runs the top segment; each party gets back the
gradient of its own embedding only.

Options: ``labels`` ``hospital`` (the default: the label party keeps the head and the
loss, U-shaped style, so no label reaches the server; two cuts) or ``server``
(vanilla-vertical: the label party sends its labels with its embedding and the server
computes the loss; one cut). The label party's step is U-shaped's or vanilla's own
client role under this mode's name; a passive party's is :class:`VerticalFront`; the
server's step waits for every party's frame (:class:`VerticalServer`, built by
:meth:`VerticalMode.joint_server_role`), so there is no one-stream server role.

Runs in process (:mod:`medsplit.training.vertical_job`) and on the platform: the agents
align their records over the relay (``hospital_agent/alignment.py``), every party's turn
of a round runs at once, and one worker task joins their steps
(:mod:`medsplit.turns.joint`, ``workers/group_runner.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from medsplit.cutting import BoundaryTensor, SplitModel
from medsplit.errors import ConfigError, ProtocolError
from medsplit.modes.base import GroupServer, ModeOption, Side, SplitMode, StartFrom
from medsplit.modes.joins import JOINS, SUM, join_embeddings
from medsplit.modes.ushaped import UShapedMode
from medsplit.modes.vanilla import VanillaMode
from medsplit.protocol.checks import BATCH as BATCH_PROBLEM
from medsplit.protocol.checks import (
    FrameLimits,
    FrameRejected,
    batch_of,
    check_batch,
    check_computed,
    check_finite,
    check_labels,
    check_training_batch,
    check_training_step,
    conforms,
)
from medsplit.protocol.party import Party
from medsplit.protocol.roles import (
    LABELS,
    LOSS,
    ClientRole,
    LossFn,
    PendingStep,
    Rollback,
    ServerRole,
    StepIds,
    StepResult,
    as_leaves,
    backward_into,
    boundary_spec,
    gradient_spec,
    refused_undone,
)
from medsplit.wire import Frame, FrameKind, FrameSpec, TensorSpec

NAME = "vertical"

JOIN = ModeOption(
    "join",
    str,
    SUM,
    "how the server joins the parties' embeddings: sum or mean (every front's output the "
    "same shape, the top unchanged), or concat along the channels (the top starts with a "
    "learned projection from the joined channels to one front's)",
    choices=JOINS,
)
LABELS_OPTION = ModeOption(
    "labels",
    str,
    Side.HOSPITAL.value,
    "hospital: the label party keeps the head and the loss (U-shaped), so no label reaches "
    "the server; server: the label party sends its labels and the server computes the loss",
    choices=(Side.HOSPITAL.value, Side.SERVER.value),
)

MIN_RECORDS = ModeOption(
    "min_records",
    int,
    100,
    "the fewest records the parties must share for the job to start: aligning a "
    "consortium on fewer could single out individual patients",
    minimum=10,
)

_VANILLA = VanillaMode()
_USHAPED = UShapedMode()


class VerticalMode(SplitMode):
    """Two or more parties, one front each, their embeddings joined at the server.

    Args:
        join: ``sum``, ``mean`` or ``concat`` (see :data:`JOIN`).
        labels: ``hospital`` (the label party holds the head) or ``server``.
        min_records: the fewest shared records a job trains on (see :data:`MIN_RECORDS`).

    Raises:
        ConfigError: an unknown join or label placement.
    """

    name = NAME
    title = "Vertical"
    summary = (
        "parties hold different features of the same patients, aligned by private set "
        "intersection; the server joins their embeddings"
    )
    cuts = 2
    labels = Side.HOSPITAL
    server_segment = 1
    feature_sets = True
    hands_on = False

    def __init__(
        self,
        join: str = SUM,
        labels: str = Side.HOSPITAL.value,
        min_records: int = MIN_RECORDS.default,
    ) -> None:
        for option, value in ((JOIN, join), (LABELS_OPTION, labels), (MIN_RECORDS, min_records)):
            problem = option.problem(value)
            if problem is not None:
                raise ConfigError(f"{NAME} mode: {problem}")
        self.join = join
        self.min_records = min_records
        self.label_side = Side(labels)
        self._base: SplitMode = _USHAPED if self.label_side == Side.HOSPITAL else _VANILLA
        self.cuts = self._base.cuts  # type: ignore[misc]
        self.labels = self._base.labels  # type: ignore[misc]

    # -- options -----------------------------------------------------------------------

    def options(self) -> tuple[ModeOption, ...]:
        return (JOIN, LABELS_OPTION, MIN_RECORDS)

    def configuration_title(self) -> str:
        where = "labels at home" if self.label_side == Side.HOSPITAL else "labels at the server"
        return f"Vertical ({self.join}, {where})"

    def with_options(self, values: Mapping[str, Any]) -> VerticalMode:
        filled = self.check_options(values)
        mine = (self.join, self.label_side.value, self.min_records)
        if (filled["join"], filled["labels"], filled["min_records"]) == mine:
            return self
        return VerticalMode(filled["join"], filled["labels"], filled["min_records"])

    def embedding_join(self) -> str:
        return self.join

    # -- parties and segments ----------------------------------------------------------

    def client_segments(self) -> dict[str, int]:
        """The label party's segments (its front, and its head with the labels at home);
        every other party holds only its front (:meth:`party_segments`)."""
        return self._base.client_segments()

    def party_segments(self, *, label_party: bool) -> dict[str, int]:
        """The segments one party holds: the label party's, or a passive party's front."""
        return self.client_segments() if label_party else {"front": 0}

    # -- the step ----------------------------------------------------------------------

    def client_role(
        self,
        parties: Mapping[str, Party],
        split: SplitModel,
        *,
        codec: str = "none",
        loss_fn: LossFn | None = None,
    ) -> ClientRole:
        """The label party's role: U-shaped's client (front, head, loss) or vanilla's
        (front, labels up), built by that mode's own hook under this mode's name."""
        build = type(self._base).client_role
        return build(self, parties, split, codec=codec, loss_fn=loss_fn)  # type: ignore[arg-type]

    def passive_role(
        self, front: Party, boundary: Sequence[BoundaryTensor], *, codec: str = "none"
    ) -> VerticalFront:
        """A passive party's role: its front, no labels, no loss."""
        return VerticalFront(front=front, boundary=tuple(boundary), codec=codec, mode=self.name)

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
        """Refused: the server's vertical step answers every party's frame at once."""
        raise ConfigError(
            f"{NAME} mode has no one-stream server role: its step joins every party's "
            "frame (VerticalMode.joint_server_role)"
        )

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
    ) -> VerticalServer:
        """The server's step over every party's frame: ``inputs`` is the one tensor each
        party's front sends, ``top_input`` the name the top segment takes the joined
        tensor under, ``head_boundary`` what the top sends the label party's head (with
        the labels at home)."""
        if (head_boundary is None) != (self.label_side == Side.SERVER):
            raise ConfigError(
                f"{NAME} mode with the labels at the {self.label_side.value}: "
                + (
                    "the top ends the model, no head boundary"
                    if head_boundary is not None
                    else "the label party's head needs the top's output boundary"
                )
            )
        return VerticalServer(
            top=top,
            inputs=inputs,
            top_input=top_input,
            head_boundary=tuple(head_boundary) if head_boundary is not None else None,
            label_party=label_party,
            join=self.join,
            job=job,
            codec=codec,
            loss_fn=loss_fn,
            limits=limits,
            mode=self.name,
        )

    # -- the round ----------------------------------------------------------------------

    def plan_round(self, participants: Sequence[Any]) -> list[tuple[Any, ...]]:
        """One group: every party takes every step of the round together."""
        return [tuple(participants)]

    def start_from(self, round_index: int, group_index: int) -> StartFrom:
        """The seeded model's segments first, then each party its own last state."""
        return StartFrom.INITIAL if round_index == 0 else StartFrom.OWN

    def result_from(self, rounds: int) -> StartFrom:
        """Each party's own state after the last round (no party holds another's)."""
        return StartFrom.OWN

    def group_server(self) -> GroupServer:
        """One top segment for the round, each step joining every party's frame."""
        return GroupServer.JOINT

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


class VerticalFront(ClientRole):
    """A passive party: runs its front, sends the embedding, applies its gradient.

    It holds no labels and never learns the loss. The gradient it received last stays
    readable (:attr:`received`): what a curious party in its place holds, which the
    label-leakage audit scores (:mod:`medsplit.training.label_leakage`).

    Args:
        front: its front segment with its optimizer.
        boundary: the one tensor its front sends.
        codec: wire codec for what it sends.
        mode: the name of the mode that built the role, written into its frames.
    """

    def __init__(
        self,
        *,
        front: Party,
        boundary: tuple[BoundaryTensor, ...],
        codec: str = "none",
        mode: str = NAME,
    ):
        self.mode = mode
        self.front = front
        self.boundary = boundary
        self.codec = codec
        self.received: torch.Tensor | None = None
        self._pending = PendingStep()
        self._outputs: dict[str, torch.Tensor] = {}
        self._samples = 0
        self._rollback: Rollback | None = None

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor | None = None) -> Frame:
        self._pending.begin(ids, who="client")
        self._rollback = Rollback(self.front)
        self._outputs = self.front.module(x)
        self._samples = x.shape[0]
        tensors = {name: t.detach() for name, t in self._outputs.items()}
        return Frame(ids.meta(FrameKind.ACTIVATIONS, self.mode, self.codec), tensors)

    def receive(self, frame: Frame) -> StepResult:
        ids = self._pending.check(frame, FrameKind.GRADIENTS, who="client")
        with refused_undone(self._rollback):
            conforms(frame, self.expect())
            check_batch(frame, self._samples)
            check_finite(frame)
            backward_into(self._outputs, frame.tensors)
            check_computed(frame, {}, self.front.module.parameters())
        self.front.step()
        self.received = next(iter(frame.tensors.values()), None)
        self._outputs = {}
        self._pending.end()
        # A passive party never learns the loss (a function of the labels).
        return StepResult(ids, loss=math.nan, samples=self._samples)

    def expect(self) -> FrameSpec:
        specs = gradient_spec(self.boundary)
        return FrameSpec(kind=FrameKind.GRADIENTS, tensors=specs, optional=frozenset(specs))


class VerticalServer:
    """The server's vertical step: every party's embedding, joined, through the top.

    With the labels at the server it computes the loss and answers every party with the
    gradient of its own embedding (the label party also with the loss). With the labels
    at home it answers the label party with the top's output, and, once that party's head
    sent the gradient back, every party with its own embedding's gradient. Every frame of
    a step is checked before anything runs: the same step in each, the batch the job
    allows and the same in each, the shapes of each party's cut, finite values.

    Args:
        top: the top segment with its optimizer (for ``concat``, with its projection).
        inputs: each party's one crossing tensor, in the parties' order (the join's).
        top_input: the keyword the top takes the joined tensor under.
        head_boundary: what the top sends the label party's head, or ``None`` when the
            top ends the model (labels at the server).
        label_party: the party whose labels train the model.
        join: ``sum``, ``mean`` or ``concat``.
        job: the job served; frames of other jobs are refused.
        codec, loss_fn, limits, mode: as for the other modes' server roles.
    """

    def __init__(
        self,
        *,
        top: Party,
        inputs: Mapping[str, BoundaryTensor],
        top_input: str,
        head_boundary: tuple[BoundaryTensor, ...] | None,
        label_party: str,
        join: str,
        job: str,
        codec: str = "none",
        loss_fn: LossFn | None = None,
        limits: FrameLimits | None = None,
        mode: str = NAME,
    ):
        if label_party not in inputs or len(inputs) < 2:
            raise ConfigError(
                f"vertical step needs two or more parties, the label party among them; got "
                f"{list(inputs)} with label party {label_party!r}"
            )
        self.mode = mode
        self.top = top
        self.inputs = dict(inputs)
        self.top_input = top_input
        self.head_boundary = head_boundary
        self.label_party = label_party
        self.join = join
        self.job = job
        self.codec = codec
        self.loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
        self.limits = limits
        self._pending = PendingStep()
        self._ids: dict[str, StepIds] = {}
        self._leaves: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, torch.Tensor] = {}
        self._samples = 0
        self._rollback: Rollback | None = None

    @property
    def parties(self) -> list[str]:
        return list(self.inputs)

    def expect(self, party: str) -> FrameSpec:
        """What ``party``'s next frame must look like."""
        if self._pending.ids is not None and party == self.label_party:
            assert self.head_boundary is not None  # a step pends only with a head
            specs = gradient_spec(self.head_boundary)
            return FrameSpec(
                kind=FrameKind.HEAD_GRADIENTS, tensors=specs, optional=frozenset(specs)
            )
        tensor = self.inputs[party]
        specs = boundary_spec((tensor,))
        if party == self.label_party and self.head_boundary is None:
            specs[LABELS] = TensorSpec((None,), torch.int64)
        return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=specs)

    def forward(self, frames: Mapping[str, Frame]) -> dict[str, Frame]:
        """One step's embeddings, one frame per party: the replies, by party.

        Raises:
            ProtocolError: not one frame from each party, or a step still in flight.
            FrameRejected: a frame failed a check; nothing was computed or learnt.
        """
        if set(frames) != set(self.inputs):
            raise ProtocolError(
                f"vertical step needs one frame from each of {self.parties}, got {sorted(frames)}"
            )
        if self._pending.ids is not None:
            raise ProtocolError(
                f"vertical server cannot start a step: step {self._pending.ids.order} is "
                "still in flight"
            )
        ids, samples = self._check_step(frames)
        rollback = Rollback(self.top)
        with refused_undone(rollback):
            leaves = {
                p: as_leaves({t.name: frames[p].tensors[t.name]})[t.name]
                for p, t in self.inputs.items()
            }
            joined = join_embeddings(self.join, [leaves[p] for p in self.parties])
            out = self.top.module(**{self.top_input: joined})
            if self.head_boundary is None:
                labels = frames[self.label_party].tensors[LABELS]
                loss = self.loss_fn(out, labels)
                loss.backward()
                grads = self._gradients(frames[self.label_party], leaves, loss.detach())
            else:
                tensors = {name: t.detach() for name, t in out.items()}
                computed = {f"output {n!r}": t for n, t in tensors.items()}
                check_computed(frames[self.label_party], computed)
        if self.head_boundary is None:
            self.top.step()
            return self._replies(ids, grads, loss.detach().float())
        label = ids[self.label_party]
        self._pending.begin(label, who="server")
        self._ids, self._leaves, self._outputs = ids, leaves, out
        self._samples, self._rollback = samples, rollback
        reply = Frame(label.meta(FrameKind.HEAD_ACTIVATIONS, self.mode, self.codec), tensors)
        return {self.label_party: reply}

    def backward(self, frame: Frame) -> dict[str, Frame]:
        """The label party's gradient at the top's output: every party's reply.

        Raises:
            ProtocolError: no step in flight, or the frame is not its next one.
            FrameRejected: the frame failed a check; the step is undone.
        """
        self._pending.check(frame, FrameKind.HEAD_GRADIENTS, who="server")
        ids = self._ids
        with refused_undone(self._rollback):
            conforms(frame, self.expect(self.label_party))
            check_batch(frame, self._samples)
            check_finite(frame)
            backward_into(self._outputs, frame.tensors)
            grads = self._gradients(frame, self._leaves, None)
        self.top.step()
        self._ids, self._leaves, self._outputs, self._rollback = {}, {}, {}, None
        self._pending.end()
        return self._replies(ids, grads, None)

    def _check_step(self, frames: Mapping[str, Frame]) -> tuple[dict[str, StepIds], int]:
        """Every frame of the step checked; each party's step ids (their positions differ
        on the platform, one turn each) and the batch size.

        Raises:
            FrameRejected: naming the party whose frame failed.
        """
        first = frames[self.label_party]
        step = (first.meta.job, first.meta.round, first.meta.step)
        sizes = {}
        for party in self.parties:
            frame = frames[party]
            if frame.meta.job != self.job:
                raise ProtocolError(
                    f"frame of job {frame.meta.job!r} from {party!r} reached the server of "
                    f"job {self.job!r}"
                )
            try:
                if (frame.meta.job, frame.meta.round, frame.meta.step) != step:
                    raise FrameRejected.of(
                        frame,
                        BATCH_PROBLEM,
                        f"round {frame.meta.round} step {frame.meta.step}, where the label "
                        f"party is at round {step[1]} step {step[2]}: the parties are not on "
                        "the same step",
                    )
                check_training_step(frame, self.limits)
                conforms(frame, self.expect(party))
                sizes[party] = batch_of(frame)
                check_training_batch(frame, sizes[party], self.limits)
                check_finite(frame)
                if party == self.label_party and self.head_boundary is None:
                    check_labels(frame, frame.tensors[LABELS], self.limits)
            except FrameRejected as e:
                raise e.sent_by(party) from e
        if len(set(sizes.values())) > 1:
            raise FrameRejected.of(
                first,
                BATCH_PROBLEM,
                f"the parties' batches differ ({sizes}): they are not on the same records",
            )
        return {p: StepIds.of(f) for p, f in frames.items()}, sizes[self.label_party]

    def _gradients(
        self, frame: Frame, leaves: Mapping[str, torch.Tensor], loss: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        grads = {p: leaf.grad for p, leaf in leaves.items() if leaf.grad is not None}
        computed = {f"gradient for {p!r}": g for p, g in grads.items()}
        if loss is not None:
            computed["loss"] = loss
        check_computed(frame, computed, self.top.module.parameters())
        return grads

    def _replies(
        self,
        ids: Mapping[str, StepIds],
        grads: Mapping[str, torch.Tensor],
        loss: torch.Tensor | None,
    ) -> dict[str, Frame]:
        replies = {}
        for party, tensor in self.inputs.items():
            tensors = {tensor.name: grads[party]} if party in grads else {}
            if loss is not None and party == self.label_party:
                tensors[LOSS] = loss
            meta = ids[party].meta(FrameKind.GRADIENTS, self.mode, self.codec)
            replies[party] = Frame(meta, tensors)
        return replies
