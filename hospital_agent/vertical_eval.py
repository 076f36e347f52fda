"""A vertical party's side of an evaluation of a completed job: its test records aligned
with the other parties' by PSI (as training's records are, on topics and a file of the
evaluation's own), its final segments on them, through the relay
(:mod:`medsplit.turns.vertical_eval`).

A prediction (asked for by the label party, ``medsplit-agent predict --job N --ids
FILE``, :mod:`hospital_agent.predict`) is the same pass on other records: the label
party's requested ones, every other party's vertical records (its training source, and
its test source where configured), aligned on topics of the prediction's own
(:func:`~hospital_agent.alignment.prediction_stage`, at least one record), no labels sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from hospital_agent.alignment import (
    AlignedRecords,
    AlignmentStage,
    FrameAgreement,
    prediction_stage,
    test_stage,
)
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.testset import vertical_test_source
from hospital_agent.data.vertical import VerticalRecords
from medsplit.modes import Side
from medsplit.protocol.handoff import import_parties
from medsplit.training.vertical_parts import (
    job_vertical_model,
    participants_in_order,
    party_parties,
)
from medsplit.turns import TurnIds
from medsplit.turns.vertical_eval import VerticalEvalOutcome, evaluate_vertical_party

logger = logging.getLogger(__name__)


class NoVerticalTestSet(DataProblem):
    """This party holds no test records (the evaluation cannot run without every party's)."""


@dataclass(frozen=True)
class VerticalEvaluation:
    """How this party's side ended: its outcome and the aligned records' count (and, for
    a prediction, the aligned records themselves, in the order of the logits' rows)."""

    outcome: VerticalEvalOutcome
    records: int
    aligned: AlignedRecords | None = None


def evaluate_vertical(taker: Any, assignment: Any, part: dict[str, Any]) -> VerticalEvaluation:
    """``taker``'s (a :class:`~hospital_agent.turns.TurnTaker`) side of the running
    evaluation ``part`` of the vertical job in ``assignment``.

    Raises:
        NoVerticalTestSet: no test records are configured.
        DataProblem, PsiError, AlignmentFailed, SealError: the test records cannot be read
            or aligned.
        VerticalEvalFailed, FrameRejected: the exchange failed.
    """
    source = vertical_test_source(taker.config.data, taker.config.test)
    if source is None:
        raise NoVerticalTestSet.one(None, "this party holds no test records")
    round_ = int(part["round"])
    return vertical_pass(
        taker,
        assignment,
        round_=round_,
        records=taker.vertical_records(assignment, source),
        stage=test_stage(round_),
    )


def answer_vertical_prediction(
    taker: Any, assignment: Any, part: dict[str, Any]
) -> VerticalEvaluation:
    """A passive party's side of its label party's prediction ``part``: all its vertical
    records (:func:`prediction_records`) aligned with the requested ones, its front on
    the intersection.

    Raises:
        as :func:`evaluate_vertical` (but never NoVerticalTestSet).
    """
    round_ = int(part["round"])
    return vertical_pass(
        taker,
        assignment,
        round_=round_,
        records=prediction_records(taker, assignment),
        stage=prediction_stage(round_),
        predict=True,
    )


def prediction_records(taker: Any, assignment: Any) -> VerticalRecords:
    """Every vertical record this party holds: its training source's, then its test
    source's where one is configured (an identifier in both counted once, the first)."""
    parts = [taker.vertical_records(assignment, taker.config.data)]
    test = vertical_test_source(taker.config.data, taker.config.test)
    if test is not None:
        parts.append(taker.vertical_records(assignment, test))
    seen: set[str] = set()
    keep: list[tuple[int, int]] = []
    for which, records in enumerate(parts):
        for row, identifier in enumerate(records.identifiers):
            if identifier not in seen:
                seen.add(identifier)
                keep.append((which, row))
    labelled = all(p.labels is not None for p in parts)
    return VerticalRecords(
        tuple(parts[w].identifiers[r] for w, r in keep),
        torch.stack([parts[w].features[r] for w, r in keep]),
        torch.stack([parts[w].labels[r] for w, r in keep]) if labelled else None,  # type: ignore[index]
    )


def vertical_pass(
    taker: Any,
    assignment: Any,
    *,
    round_: int,
    records: VerticalRecords,
    stage: AlignmentStage,
    predict: bool = False,
) -> VerticalEvaluation:
    """``records`` aligned with every other party's for ``stage``, then this party's side
    of the pass over them (an evaluation's, or with ``predict`` a prediction's: no labels
    sent, the logits at the label party).

    Raises:
        DataProblem: this party's final segments are not kept here.
        PsiError, AlignmentFailed, SealError: the records cannot be aligned.
        VerticalEvalFailed, FrameRejected: the exchange failed.
    """
    model, config = assignment.model(), assignment.config()
    fronts = assignment.description().party_fronts()
    me = taker.me
    aligned = taker.align_vertical(
        assignment,
        records,
        coordinator=FrameAgreement(),
        stage=stage,
        minimum=1 if predict else None,
    )
    order = participants_in_order(assignment.raw["participants"])
    joint = job_vertical_model(model, config, order, tuple(fronts))
    final = taker.keep_final(assignment)
    if final is None:
        raise DataProblem.one(None, "this party's final segments are not kept here")
    parties = party_parties(joint, config, me)
    import_parties(final.read_bytes(), parties)
    label_party = order[0] == me
    train_labels = None
    if label_party and not predict:
        train_labels = taker.vertical_records(assignment, taker.config.data).labels
    ids = TurnIds(config.job, round_, int(assignment.raw["position"]), config.mode)
    channel = taker.relay.channel()
    logger.info(
        "job %s: its final model %s on %d aligned records", assignment.job,
        "predicting" if predict else "evaluated", len(aligned.alignment),
    )  # fmt: skip
    try:
        outcome = evaluate_vertical_party(
            channel=channel,
            streams=assignment.relay_keys.streams(config.job, me),
            ids=ids,
            front=parties["front"],
            boundary=joint.inputs[me],
            features=aligned.features,
            digest=aligned.alignment.digest(),
            batch_size=config.batch_size,
            head=parties.get("head"),
            head_boundary=joint.head_boundary,
            labels=aligned.labels if label_party and not predict else None,
            labels_at_server=config.split_mode.labels == Side.SERVER,
            train_labels=train_labels,
            task=config.task,
            reply_timeout=taker.config.reply_timeout,
            device=taker.config.device,
            predict=predict,
            label_party=label_party,
            num_classes=model.num_classes,
        )
    finally:
        channel.close()
    return VerticalEvaluation(outcome, len(aligned.alignment), aligned if predict else None)
