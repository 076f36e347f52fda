"""A vertical job's final model scored through the split on the parties' aligned test
records: every party's front at home, the top on a worker, the head at the label party.

The parties align their test records by PSI as training aligns its records (the agent's
``hospital_agent/alignment.py`` on the test sets), so each holds the same records in the
same order without an identifier leaving the intersection. Then, for test batch ``i``
(the aligned records ``i*B .. (i+1)*B``, ``B`` the job's batch size), every party sends one
``eval_activations`` frame: its front's embedding, the intersection's size (``records``)
and digest (``alignment_0..3``, four int64 scalars), and, with the labels at the server,
the label party's labels. The worker (:class:`VerticalEvalServer`) checks every party's
frame of the batch (kind, batch index, shapes and dtypes of the party's cut, the batch's
size, finite values, the same size and digest in each: the same records in the same
order), joins the embeddings, runs the top in eval mode without gradients and answers
each party ``eval_outputs``: the label party with the labels at home gets the top's
output (its head makes logits), every other party an empty one. After the last batch the
label party sends its ``metrics`` (with the labels at home the whole classification's
figures, computed beside its labels; at the server only the majority baseline, the
server computing the rest from the logits and labels it holds), checked, answered
``done``. A frame that fails a check is answered ``stopped`` to every party and nothing is
recorded; nothing trains on either side.

A prediction (``predict=True``, asked for by the label party: ``medsplit-agent predict
--job N --ids FILE``) is the same pass over the records the label party named, aligned
by PSI with every other party's records, without labels and without a metrics frame:
the label party's frames carry no labels; with the labels at home it gets the top's
output as in an evaluation (its head makes the logits), with the labels at the server
the worker answers it the top's logits (``logits``), and every other party an empty
answer, so the logits only ever reach the label party. After the last batch every party
is answered ``done``.

There is no handshake and no resume: an evaluation is one pass in a round of its own
(:func:`~medsplit.turns.evaluation.evaluation_round`); a failed one is asked again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import BoundaryTensor
from medsplit.errors import MedSplitError
from medsplit.modes.joins import join_embeddings
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LABELS, boundary_spec, eval_mode
from medsplit.training.evaluate import majority_baseline, task_metrics
from medsplit.turns import control
from medsplit.turns.control import TurnIds
from medsplit.turns.evaluation import BASELINE_METRIC
from medsplit.turns.frameio import FrameCounters, FrameIO
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind, FrameSpec, TensorSpec

__all__ = [
    "LOGITS",
    "RECORDS",
    "VerticalEvalFailed",
    "VerticalEvalServed",
    "VerticalEvalServer",
    "alignment_scalars",
    "evaluate_vertical_party",
    "serve_vertical_evaluation",
]

#: The scalar every party's frame carries: how many aligned test records it holds.
RECORDS = "records"
#: The intersection's SHA-256 digest as four int64 scalars (a scalar carries no batch).
DIGEST_WORDS = tuple(f"alignment_{i}" for i in range(4))
_SCALAR = TensorSpec((), torch.int64)
#: The tensor a prediction's answer to the label party carries with the labels at the
#: server: the top's logits of the batch.
LOGITS = "logits"
#: The figures the label party's metrics frame may hold (the labels at home: all).
_HOME_METRICS = frozenset({"val_loss", "val_accuracy", "val_auc", "val_samples", BASELINE_METRIC})
_SHARES = frozenset({"val_accuracy", "val_auc", BASELINE_METRIC})


class VerticalEvalFailed(MedSplitError):
    """A vertical evaluation ended without figures: a party went silent or the server
    stopped it (the reason, naming the party and the check, stays with the server)."""


def alignment_scalars(digest: str, records: int) -> dict[str, torch.Tensor]:
    """The size and the hex SHA-256 ``digest`` of the aligned test records as frame
    scalars (:data:`RECORDS`, :data:`DIGEST_WORDS`)."""
    raw = bytes.fromhex(digest)
    if len(raw) != 32:
        raise ValueError(f"an alignment digest is 32 bytes, got {len(raw)}")
    words = [int.from_bytes(raw[i * 8 : (i + 1) * 8], "big", signed=True) for i in range(4)]
    out = {
        name: torch.tensor(w, dtype=torch.int64)
        for name, w in zip(DIGEST_WORDS, words, strict=True)
    }
    out[RECORDS] = torch.tensor(records, dtype=torch.int64)
    return out


def _batch_size(records: int, batch: int, index: int) -> int:
    return max(0, min(batch, records - index * batch))


@dataclass
class VerticalEvalServer:
    """The worker's side of one vertical evaluation (see the module docstring).

    Args:
        top: the job's final top segment; only read.
        inputs: each party's one crossing tensor, in the parties' (the join's) order.
        top_input: the keyword the top takes the joined tensor under.
        head_boundary: what the top sends the label party's head; ``None``: labels at the
            server (the top ends the model).
        label_party: the party whose labels score the model.
        join: ``sum``, ``mean`` or ``concat``.
        batch_size: the job's batch (the test batches' size, the last one shorter).
        max_records: each party's reported test-set size: the intersection is no larger.
        num_classes, task: the job's.
        predict: a prediction, not an evaluation: no labels come up, the label party is
            answered the logits (labels at the server), no metrics frame closes it.
    """

    top: Party
    inputs: Mapping[str, BoundaryTensor]
    top_input: str
    head_boundary: tuple[BoundaryTensor, ...] | None
    label_party: str
    join: str
    batch_size: int
    max_records: Mapping[str, int]
    num_classes: int | None
    task: str = "classification"
    predict: bool = False
    records: int | None = None
    digest: tuple[int, ...] | None = None
    _logits: list[torch.Tensor] = field(default_factory=list)
    _labels: list[torch.Tensor] = field(default_factory=list)

    @property
    def parties(self) -> list[str]:
        return list(self.inputs)

    @property
    def batches(self) -> int:
        """How many test batches the intersection makes (known after the first batch)."""
        assert self.records is not None
        return math.ceil(self.records / self.batch_size)

    def expect(self, party: str) -> FrameSpec:
        """What ``party``'s test-batch frame must look like."""
        specs = boundary_spec((self.inputs[party],))
        specs.update({name: _SCALAR for name in (*DIGEST_WORDS, RECORDS)})
        if party == self.label_party and self.head_boundary is None and not self.predict:
            specs[LABELS] = TensorSpec((None,), torch.int64)
        return FrameSpec(kind=FrameKind.EVAL_ACTIVATIONS, tensors=specs)

    def forward(self, frames: Mapping[str, Frame], index: int) -> dict[str, Frame]:
        """Test batch ``index``'s frame of every party in: each party's answer out.

        Raises:
            FrameRejected: a frame failed a check, naming its party; nothing was computed.
        """
        if set(frames) != set(self.inputs):
            raise FrameRejected(
                checks.STEPS,
                f"a test batch needs one frame of each of {self.parties}, got {sorted(frames)}",
            )
        for party in self.parties:
            try:
                self._check(frames[party], party, index)
            except FrameRejected as e:
                raise e.sent_by(party) from e
        embeddings = [frames[p].tensors[self.inputs[p].name] for p in self.parties]
        with eval_mode([self.top.module]), torch.no_grad():
            out = self.top.module(**{self.top_input: join_embeddings(self.join, embeddings)})
        answers = {}
        for party in self.parties:
            tensors: dict[str, torch.Tensor] = {}
            if party == self.label_party and self.head_boundary is None:
                logits = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
                if self.predict:  # the label party's prediction: its logits, to it alone
                    tensors = {LOGITS: logits.detach()}
                else:
                    self._logits.append(logits.detach())
                    self._labels.append(frames[party].tensors[LABELS])
            elif party == self.label_party:
                tensors = {name: t.detach() for name, t in out.items()}
            meta = frames[party].meta
            ids = TurnIds(meta.job, meta.round, meta.position, meta.mode, meta.codec)
            answers[party] = ids.frame(FrameKind.EVAL_OUTPUTS, index, tensors)
        return answers

    def _check(self, frame: Frame, party: str, index: int) -> None:
        if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS or frame.meta.step != index:
            raise FrameRejected.of(
                frame,
                checks.STEPS,
                f"a {frame.meta.kind} frame for batch {frame.meta.step} came where test "
                f"batch {index}'s eval_activations were due",
            )
        checks.conforms(frame, self.expect(party))
        records = int(frame.tensors[RECORDS])
        digest = tuple(int(frame.tensors[w]) for w in DIGEST_WORDS)
        if self.records is None:
            if not 1 <= records <= min(self.max_records.values()):
                raise FrameRejected.of(
                    frame,
                    checks.BATCH,
                    f"{records} aligned test records; the parties reported test sets of "
                    f"{dict(self.max_records)}, and the intersection is no larger",
                )
            self.records, self.digest = records, digest
        elif (records, digest) != (self.records, self.digest):
            raise FrameRejected.of(
                frame,
                checks.BATCH,
                f"its aligned test records ({records}, digest differs: "
                f"{digest != self.digest}) are not the other parties' ({self.records}): "
                "the parties are not on the same records in the same order",
            )
        want = _batch_size(self.records, self.batch_size, index)
        if want < 1:
            raise FrameRejected.of(
                frame, checks.STEPS, f"test batch {index} past the last of {self.batches}"
            )
        checks.check_batch(frame, want)
        checks.check_finite(frame)
        if LABELS in frame.tensors:
            limits = FrameLimits(
                batch_size=self.batch_size,
                exact_batch=False,
                num_classes=self.num_classes,
                train_steps=0,
                val_samples=self.records,
            )
            checks.check_labels(frame, frame.tensors[LABELS], limits)

    def results(self, frame: Frame) -> dict[str, float]:
        """The label party's closing ``metrics`` frame, checked: the evaluation's figures
        (``val_*`` names, as other modes' metrics frames give them).

        Raises:
            FrameRejected: not a metrics frame after the last batch, unknown or
                impossible figures, or another sample count than the intersection's.
        """
        assert self.records is not None
        if frame.meta.kind != FrameKind.METRICS or frame.meta.step != self.batches:
            raise FrameRejected.of(
                frame,
                checks.STEPS,
                f"a {frame.meta.kind} frame at step {frame.meta.step}: the label party's "
                f"metrics were due after the last test batch ({self.batches})",
            )
        values = control.metric_values(frame)
        allowed = _HOME_METRICS if self.head_boundary is not None else {BASELINE_METRIC}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise FrameRejected.of(frame, checks.METRICS, f"figures {unknown} are not its own")
        for name in _SHARES & set(values):
            if not 0.0 <= values[name] <= 1.0:
                raise FrameRejected.of(frame, checks.METRICS, f"{name} {values[name]} not a share")
        if self.head_boundary is None:
            labels = torch.cat(self._labels)
            values.update(task_metrics(self.task, torch.cat(self._logits), labels))
        if values.get("val_samples") != float(self.records):
            raise FrameRejected.of(
                frame,
                checks.METRICS,
                f"{values.get('val_samples')} samples scored, {self.records} aligned",
            )
        return values


@dataclass
class VerticalEvalServed:
    """How a vertical evaluation ended at the server: its figures (``None``: refused,
    ``refused`` says why), the records scored and each party's frame counters."""

    figures: dict[str, float] | None = None
    records: int = 0
    predicted: bool = False
    refused: str = ""
    counters: dict[str, FrameCounters] = field(default_factory=dict)


def serve_vertical_evaluation(
    *,
    channel: Channel,
    streams: Mapping[str, StreamPair],
    ids: Mapping[str, TurnIds],
    server: VerticalEvalServer,
    silence_timeout: float = 120.0,
    poll: float = 1.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    interrupted: Callable[[], bool] = lambda: False,
) -> VerticalEvalServed:
    """Serve every party's test batches, then take the label party's metrics (see the
    module docstring). A refused frame is answered ``stopped`` to every party.

    Raises:
        VerticalEvalFailed: a party sent nothing for ``silence_timeout`` seconds.
    """
    ios = {
        p: FrameIO(
            channel,
            inbound=streams[p].up,
            outbound=streams[p].down,
            ids=ids[p],
            max_frame_bytes=max_frame_bytes,
            where=f"vertical evaluation {ids[p].job} round {ids[p].round} at {p}",
        )
        for p in server.parties
    }
    served = VerticalEvalServed(counters={p: io.counters for p, io in ios.items()})

    def next_of(party: str, at: int) -> Frame | None:
        try:
            return ios[party].next_frame(
                silence_timeout=silence_timeout,
                poll=poll,
                interrupted=interrupted,
                silent=lambda waited, err: VerticalEvalFailed(
                    f"{party} sent nothing for {waited:.0f} s at test batch {at}{err}"
                ),
            )
        except FrameRejected as e:
            raise e.sent_by(party) from e

    def stop(step: int, reason: str) -> VerticalEvalServed:
        served.refused = reason
        for p, io in ios.items():
            io.send(control.signal(ids[p], FrameKind.STOPPED, step))
        return served

    index = 0
    try:
        while server.records is None or index < server.batches:
            frames = {}
            for party in server.parties:
                frame = next_of(party, index)
                if frame is None:
                    return stop(index, "interrupted")
                frames[party] = frame
            for party, answer in server.forward(frames, index).items():
                ios[party].send(answer)
            index += 1
        if server.predict:  # nothing closes a prediction but the server's done
            served.predicted = True
            served.records = server.records or 0
            for p, io in ios.items():
                io.send(control.signal(ids[p], FrameKind.DONE, index))
            return served
        frame = next_of(server.label_party, index)
        if frame is None:
            return stop(index, "interrupted")
        try:
            served.figures = server.results(frame)
        except FrameRejected as e:
            raise e.sent_by(server.label_party) from e
    except FrameRejected as e:
        return stop(index, str(e))
    except VerticalEvalFailed as e:  # a silent party: the others are told, not left waiting
        stop(index, str(e))
        raise
    served.records = server.records or 0
    for p, io in ios.items():
        io.send(control.signal(ids[p], FrameKind.DONE, index))
    return served


@dataclass
class VerticalEvalOutcome:
    """What one party's side of a vertical evaluation ends with: the label party's
    logits with the labels at home (else ``None``) and its metrics, and the frames'
    counters."""

    logits: torch.Tensor | None
    metrics: dict[str, float]
    counters: FrameCounters


def evaluate_vertical_party(
    *,
    channel: Channel,
    streams: StreamPair,
    ids: TurnIds,
    front: Party,
    boundary: BoundaryTensor,
    features: torch.Tensor,
    digest: str,
    batch_size: int,
    head: Party | None = None,
    head_boundary: tuple[BoundaryTensor, ...] | None = None,
    labels: torch.Tensor | None = None,
    labels_at_server: bool = False,
    train_labels: torch.Tensor | None = None,
    task: str = "classification",
    reply_timeout: float = 120.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    device: torch.device | str = "cpu",
    predict: bool = False,
    label_party: bool | None = None,
    num_classes: int | None = None,
) -> VerticalEvalOutcome:
    """One party's side over its aligned test ``features`` (in the alignment's order):
    its front's embedding of each test batch up; at the label party (``labels`` given)
    the head's logits of each answer (labels at home) and the closing metrics frame.

    With ``predict`` (a prediction: no ``labels`` anywhere, ``label_party`` says whether
    this is the label party) the label party's logits come from its head (labels at
    home) or the server's ``logits`` answer (labels at the server, ``num_classes`` wide),
    each checked, and no metrics frame is sent.

    Raises:
        VerticalEvalFailed: the server stopped the evaluation, or did not answer in time.
        FrameRejected: the server's answer failed a check; nothing of it was used.
    """
    io = FrameIO(
        channel,
        inbound=streams.down,
        outbound=streams.up,
        ids=ids,
        max_frame_bytes=max_frame_bytes,
        where=f"vertical evaluation {ids.job} round {ids.round}",
    )
    records = len(features)
    scalars = alignment_scalars(digest, records)
    if label_party is None:
        label_party = labels is not None
    if predict and labels is not None:
        raise ValueError("a prediction sends no labels")
    if predict and label_party and labels_at_server and num_classes is None:
        raise ValueError("the label party's prediction needs the job's num_classes")
    home = label_party and not labels_at_server
    if home and (head is None or head_boundary is None):
        raise ValueError("the label party with the labels at home needs its head")
    out: list[torch.Tensor] = []
    batches = math.ceil(records / batch_size)
    answer_to = functools.partial(
        io.answer,
        timeout=reply_timeout,
        failed=VerticalEvalFailed,
        unit="test batch",
        exchange="evaluation",
    )
    for index in range(batches):
        rows = slice(index * batch_size, (index + 1) * batch_size)
        x = features[rows].to(device)
        with eval_mode([front.module]), torch.no_grad():
            embedding = front.module(x)[boundary.name].detach().cpu()
        tensors = {boundary.name: embedding, **scalars}
        if label_party and labels_at_server and not predict:
            assert labels is not None
            tensors[LABELS] = labels[rows]
        io.send(ids.frame(FrameKind.EVAL_ACTIVATIONS, index, tensors))
        answer = answer_to(FrameKind.EVAL_OUTPUTS, index)
        if predict and label_party and labels_at_server:
            spec = FrameSpec(
                kind=FrameKind.EVAL_OUTPUTS,
                tensors={LOGITS: TensorSpec((None, num_classes), torch.float32)},
            )
            checks.conforms(answer, spec)
            checks.check_batch(answer, len(x))
            checks.check_finite(answer)
            out.append(answer.tensors[LOGITS])
            continue
        if not home:
            checks.conforms(answer, FrameSpec(kind=FrameKind.EVAL_OUTPUTS, tensors={}))
            continue
        assert head is not None and head_boundary is not None
        spec = FrameSpec(kind=FrameKind.EVAL_OUTPUTS, tensors=boundary_spec(head_boundary))
        checks.conforms(answer, spec)
        checks.check_batch(answer, len(x))
        checks.check_finite(answer)
        inputs = {name: t.to(device) for name, t in answer.tensors.items()}
        with eval_mode([head.module]), torch.no_grad():
            out.append(head.module(**inputs).cpu())
    metrics: dict[str, float] = {}
    logits = torch.cat(out) if out else None
    if predict:
        answer_to(FrameKind.DONE, batches)
        return VerticalEvalOutcome(logits, metrics, io.counters)
    if label_party:
        assert labels is not None
        if logits is not None:
            metrics.update(task_metrics(task, logits, labels))
        if train_labels is not None:
            metrics[BASELINE_METRIC] = majority_baseline(train_labels, labels).accuracy
        io.send(control.metrics(ids, batches, metrics))
    answer_to(FrameKind.DONE, batches)
    return VerticalEvalOutcome(logits, metrics, io.counters)
