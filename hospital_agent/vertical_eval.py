"""A vertical party's side of an evaluation of a completed job: its test records aligned
with the other parties' by PSI (as training's records are, on topics and a file of the
evaluation's own), its final segments on them, through the relay
(:mod:`medsplit.turns.vertical_eval`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hospital_agent.alignment import FrameAgreement, align_records, test_stage
from hospital_agent.data import load_vertical
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
    own = {front.party: front.model for front in fronts}.get(me, model)
    source = vertical_test_source(taker.config.data, taker.config.test)
    if source is None:
        raise NoVerticalTestSet.one(None, "this party holds no test records")
    table = taker.config.data.kind == "table"
    records = load_vertical(
        source,
        input_shape=None if table else own.input_shape,
        num_classes=model.num_classes,
    )
    round_ = int(part["round"])
    aligned = align_records(
        relay=taker.relay,
        keys=assignment.relay_keys,
        coordinator=FrameAgreement(),
        job=assignment.job,
        me=me,
        participants=assignment.raw["participants"],
        records=records,
        seed=config.seed,
        minimum=int(config.mode_options["min_records"]),
        identity=taker.identity,
        pins=taker.pins,
        job_keys=taker.job_keys,
        folder=taker.jobs_dir(assignment.job),
        timeout=taker.config.reply_timeout,
        stopping=taker.stopping,
        stage=test_stage(round_),
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
        train_labels = load_vertical(
            taker.config.data,
            input_shape=None if table else own.input_shape,
            num_classes=model.num_classes,
        ).labels
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
