"""The scheduler's tasks. Each takes ids, loads fresh state, calls services, and is safe
to run twice (a duplicate finds nothing to do)."""

from __future__ import annotations

import logging
import os
import socket
import uuid

import redis
from django.conf import settings

from exports.services import exports_to_seal
from hospitals.errors import RelayProvisioningFailed
from training.aggregation import (
    aggregation_dispatched,
    aggregations_overdue,
    aggregations_to_sum,
    turns_overdue,
)
from training.evaluation import evaluation_dispatched, evaluations_to_run
from training.inference import inference_dispatched, inferences_to_run
from training.scheduling import (
    job_advance_group,
    jobs_to_advance,
    turn_dispatched,
    turns_without_runner,
)
from workers import (
    aggregation_runner,
    evaluation_runner,
    export_runner,
    group_runner,
    inference_runner,
    relay_watch,
    turn_runner,
)
from workers.celery_app import app

logger = logging.getLogger(__name__)


@app.task(name="medsplit.advance_job")
def advance_job(job_id: int) -> None:
    """Start a scheduled job or move a running one on; send each turn of its current
    group to a worker (the turns of one group run at the same time)."""
    turns = job_advance_group(job_id=job_id)
    if turns and group_runner.shares_segment(turns[0].job):
        turns = turns[:1]  # one task serves the whole group on its one server segment
    for turn in turns:
        _send_turn(turn.pk)
    for aggregation_id in aggregations_to_sum(job_id=job_id):
        _send_aggregation(aggregation_id)
    # A job that completed: its final model, evaluated at each hospital with a test set.
    for part_id in evaluations_to_run(job_id=job_id):
        _send_evaluation(part_id)


@app.task(name="medsplit.evaluate_at_hospital")
def evaluate_at_hospital(part_id: int) -> str:
    """Serve one hospital's evaluation of a completed job (its test batches through the
    job's final server segment); an infrastructure failure sends it again later."""
    runner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    result = evaluation_runner.run(part_id, runner=runner)
    if result.retry:
        evaluation_dispatched(part_id=part_id)
        evaluate_at_hospital.apply_async((part_id,), countdown=5.0)
    return result.outcome


@app.task(name="medsplit.aggregate_round")
def aggregate_round(aggregation_id: int) -> str:
    """Sum the masked submissions of a secure aggregation attempt; then move the job on."""
    result = aggregation_runner.run(aggregation_id)
    if result.job_id is not None:
        advance_job.delay(result.job_id)
    return result.outcome


@app.task(name="medsplit.run_turn")
def run_turn(turn_id: int) -> str:
    """Run the server side of a turn (it may take minutes); then move the job on."""
    runner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    if group_runner.group_of_shared_segment(turn_id):
        outcome = group_runner.run(turn_id, runner=runner)
        job_id = group_runner.job_of(turn_id)
        if outcome != "not claimed" and job_id is not None:
            advance_job.delay(job_id)
        return outcome
    result = turn_runner.run(turn_id, runner=runner)
    if result.advance:
        advance_job.delay(result.job_id)
    if result.retry_in is not None:
        # The same attempt again, after the database, the relay or the storage came back.
        _send_turn(turn_id, countdown=result.retry_in)
    return result.outcome


@app.task(name="medsplit.infer")
def infer(request_id: int) -> str:
    """Serve one hospital's inference request with the job's final server segment."""
    runner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return inference_runner.run(request_id, runner=runner)


def send_inference(request_id: int) -> None:
    """Send inference request ``request_id`` to the inference queue (the setting)."""
    inference_dispatched(request_id=request_id)
    infer.apply_async((request_id,), queue=settings.MEDSPLIT["INFERENCE_QUEUE"])


@app.task(name="medsplit.seal_export")
def seal_export(export_id: int) -> str:
    """Seal an approved export's server segment to the receiving hospital's export key."""
    return export_runner.run(export_id)


@app.task(name="medsplit.sweep")
def sweep() -> None:
    """Find work nobody is doing: scheduled jobs, lost follow-ups, turns whose worker died;
    and hold every hospital to what its jobs allow it to store on the relay."""
    for job_id in jobs_to_advance():
        advance_job.delay(job_id)
    # Parallel rounds past their deadline: stragglers and missing submissions are left
    # to each job's failure policy (the follow-up advance comes on commit).
    turns_overdue()
    aggregations_overdue()
    for aggregation_id in aggregations_to_sum():
        _send_aggregation(aggregation_id)
    for turn_id in turns_without_runner():
        logger.info("turn %s has no live runner; sending it to a worker", turn_id)
        _send_turn(turn_id)
    for part_id in evaluations_to_run():
        _send_evaluation(part_id)
    for request_id in inferences_to_run():
        send_inference(request_id)
    for export_id in exports_to_seal():
        seal_export.delay(export_id)
    try:
        relay_watch.sweep_relay()
    except (redis.RedisError, RelayProvisioningFailed) as e:
        # The relay being away is the turns' problem, reported there; the next sweep checks.
        logger.warning("relay check skipped: %s", e)


def _send_turn(turn_id: int, *, countdown: float = 0.0) -> None:
    turn_dispatched(turn_id=turn_id, delay=countdown)
    run_turn.apply_async((turn_id,), countdown=countdown)


def _send_evaluation(part_id: int) -> None:
    evaluation_dispatched(part_id=part_id)
    evaluate_at_hospital.delay(part_id)


def _send_aggregation(aggregation_id: int) -> None:
    aggregation_dispatched(aggregation_id=aggregation_id)
    aggregate_round.delay(aggregation_id)
