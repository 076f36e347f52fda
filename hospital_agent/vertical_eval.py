"""A vertical party's side of an evaluation of a completed job: its test records aligned
with the other parties' by PSI (as training's records are, on topics and a file of the
evaluation's own), its final segments on them, through the relay
(:mod:`medsplit.turns.vertical_eval`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hospital_agent.alignment import FrameAgreement, test_stage
from hospital_agent.data.problems import DataProblem
from hospital_agent.data.testset import vertical_test_source
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
    """How this party's side ended: its outcome and the aligned test records' count."""

    outcome: VerticalEvalOutcome
    records: int


def evaluate_vertical(taker: Any, assignment: Any, part: dict[str, Any]) -> VerticalEvaluation:
    """``taker``'s (a :class:`~hospital_agent.turns.TurnTaker`) side of the running
    evaluation ``part`` of the vertical job in ``assignment``.

    Raises:
        NoVerticalTestSet: no test records are configured.
        DataProblem, PsiError, AlignmentFailed, SealError: the test records cannot be read
            or aligned.
        VerticalEvalFailed, FrameRejected: the exchange failed.
    """
    model, config = assignment.model(), assignment.config()
    fronts = assignment.description().party_fronts()
    me = taker.me
    source = vertical_test_source(taker.config.data, taker.config.test)
    if source is None:
        raise NoVerticalTestSet.one(None, "this party holds no test records")
    records = taker.vertical_records(assignment, source)
    round_ = int(part["round"])
    aligned = taker.align_vertical(
        assignment, records, coordinator=FrameAgreement(), stage=test_stage(round_)
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
    if label_party:
        train_labels = taker.vertical_records(assignment, taker.config.data).labels
    ids = TurnIds(config.job, round_, int(assignment.raw["position"]), config.mode)
    channel = taker.relay.channel()
    logger.info(
        "job %s: evaluating its final model on %d aligned test records", assignment.job,
        len(aligned.alignment),
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
            labels=aligned.labels if label_party else None,
            labels_at_server=config.split_mode.labels == Side.SERVER,
            train_labels=train_labels,
            task=config.task,
            reply_timeout=taker.config.reply_timeout,
            device=taker.config.device,
        )
    finally:
        channel.close()
    return VerticalEvaluation(outcome, len(aligned.alignment))
