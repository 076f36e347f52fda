"""The server side of one hospital's evaluation of a completed job, run by a worker:
claim it, load the job's final server segment, serve the hospital's test batches over
the relay (``medsplit.turns.evaluation``), record its figures. A vertical job's
evaluation, and its label party's prediction (``training/vertical_prediction.py``: the
same joint pass without labels or figures), is one task serving every party.

Nothing is written but the figures: the server segment starts from the job's final
checkpoint in memory and its state is never saved (an evaluation trains nothing).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.models import require_model_module
from medsplit.modes import require_mode
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.training.setup import cached_split, server_party
from medsplit.training.vertical_parts import job_vertical_model
from medsplit.turns import Directive, TurnFailed, TurnIds, TurnProgress
from medsplit.turns.evaluation import (
    evaluation_limits,
    evaluation_results,
    evaluation_round,
    evaluation_server,
)
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from medsplit.turns.vertical_eval import VerticalEvalServer, serve_vertical_evaluation
from training.evaluation import (
    MAX_RUNS,
    evaluation_claim,
    evaluation_directive,
    evaluation_fail,
    evaluation_finish,
    evaluation_finish_joint,
    evaluation_release,
    joint_evaluation,
)
from training.models import Evaluation, HospitalEvaluation, Job
from training.runs import checkpoint_dir
from training.vertical_prediction import prediction_finish
from workers.failures import FailureKind, classify
from workers.relay_watch import limits_of_job
from workers.turn_runner import EXTRA_MODES_SETTING, job_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationRun:
    """How a run ended; ``retry``: give it to a worker again (an infrastructure failure)."""

    outcome: str
    job_id: int | None = None
    retry: bool = False


def final_server_state(job: Job, fresh: bytes) -> bytes:
    """The job's final server segment: its server checkpoint as the job's last turn (or
    the combination of its last group) left it, verified; ``fresh`` when it has none (a
    job that trained no step)."""
    row = Job.objects.select_related("server_checkpoint").get(pk=job.pk).server_checkpoint
    if row is None:
        return fresh
    return read_verified(checkpoint_dir() / row.path, row.sha256)


def run(part_id: int, *, runner: str) -> EvaluationRun:
    """Claim hospital evaluation ``part_id`` and serve it until it completes or fails."""
    options = settings.MEDSPLIT
    lease = options["TURN_LEASE_SECONDS"]
    part = evaluation_claim(part_id=part_id, runner=runner, lease_seconds=lease)
    if part is None:
        return EvaluationRun("not claimed")
    if part.runs > MAX_RUNS:
        evaluation_fail(
            part=part,
            reason=f"the evaluation's server side was started {part.runs} times without "
            f"finishing, more than the {MAX_RUNS} allowed",
        )
        return EvaluationRun("failed", part.job_id)
    job = part.job
    if joint_evaluation(job):
        return _run_joint(part, runner=runner, lease=lease)
    channel: RedisChannel | None = None
    try:
        require_mode(job.mode, setting=EXTRA_MODES_SETTING)
        config = job.training_config()
        description = job.job_description()
        split = cached_split(job_model(job), config.cuts)
        ids = TurnIds(
            config.job,
            evaluation_round(job.rounds, part.evaluation.attempt),
            part.position,
            config.mode,
            config.codec,
        )
        party = server_party(split, config)
        state = final_server_state(job, export_parties({"server": party}))
        bounds = limits_of_job(job)
        channel = RedisChannel(
            options["WORKER_REDIS_URL"],
            max_message_bytes=bounds.frame_bytes,
            max_backlog_bytes=bounds.stream_bytes,
        )
        hooks = EvaluationHooks(part=part, runner=runner, lease_seconds=lease)
        server = evaluation_server(
            ids=ids,
            channel=channel,
            streams=relay_keys().streams(config.job, part.hospital.slug),
            split=split,
            party=party,
            final_state=state,
            hooks=hooks,
            limits=evaluation_limits(
                config,
                num_classes=description.num_classes,
                test_samples=part.test_samples,
                label_shape=description.label_shape,
            ),
            config=config,
            hospital=part.hospital.slug,
            silence_timeout=options["TURN_SILENCE_SECONDS"],
            reset_streams=part.runs > 1,
        )
        logger.info(
            "evaluation %s of job %s at %s: served by %s (%d test samples)",
            part.evaluation.attempt,
            job.pk,
            part.hospital.slug,
            runner,
            part.test_samples,
        )
        outcome = server.run()
        return EvaluationRun(outcome.value, job.pk)
    except Exception as e:  # every failure ends somewhere
        reason = f"{type(e).__name__}: {e}"
        if classify(e) == FailureKind.INFRASTRUCTURE:
            logger.warning("evaluation %s: infrastructure failure, again later: %s", part_id, e)
            return EvaluationRun("retry", job.pk, retry=True)
        logger.warning("evaluation %s failed: %s", part_id, reason)
        evaluation_fail(part=part, reason=reason)
        return EvaluationRun("failed", job.pk)
    finally:
        evaluation_release(part_id=part.pk, runner=runner)
        if channel is not None:
            channel.close()


def _run_joint(part: HospitalEvaluation, *, runner: str, lease: float) -> EvaluationRun:
    """A vertical job's evaluation: every party's part claimed by this runner and served
    at once, each test batch joining every party's frame (``medsplit.turns.vertical_eval``)."""
    options = settings.MEDSPLIT
    job = part.job
    claims = [part]
    others = (
        HospitalEvaluation.objects.filter(evaluation=part.evaluation)
        .exclude(pk=part.pk)
        .order_by("position")
    )
    try:
        for other in others:
            held = evaluation_claim(part_id=other.pk, runner=runner, lease_seconds=lease)
            if held is None:  # another runner serves it (or it ended): leave it
                return EvaluationRun("not claimed", job.pk)
            claims.append(held)
        claims.sort(key=lambda p: p.position)
        return _serve_joint(job, claims, runner=runner, lease=lease, options=options)
    finally:
        for held in claims:
            evaluation_release(part_id=held.pk, runner=runner)


def _serve_joint(
    job: Job, parts: list[HospitalEvaluation], *, runner: str, lease: float, options: dict
) -> EvaluationRun:
    def fail_all(reason: str) -> None:
        for p in parts:
            evaluation_fail(part=p, reason=reason)

    if any(p.runs > MAX_RUNS for p in parts):
        fail_all(f"the evaluation's server side was started more than {MAX_RUNS} times")
        return EvaluationRun("failed", job.pk)
    channel: RedisChannel | None = None
    try:
        require_mode(job.mode, setting=EXTRA_MODES_SETTING)
        config = job.training_config()
        description = job.job_description()
        predict = parts[0].evaluation.purpose == Evaluation.Purpose.PREDICTION
        what = "prediction" if predict else "evaluation"
        slugs = tuple(p.hospital.slug for p in parts)
        fronts = description.party_fronts()
        for front in fronts:
            require_model_module(front.model.name)
        model = job_vertical_model(job_model(job), config, slugs, fronts)
        top = Party.create(copy.deepcopy(model.top), config.server_optimizer)
        import_parties(
            final_server_state(job, export_parties({SERVER_PARTY: top})), {SERVER_PARTY: top}
        )
        server = VerticalEvalServer(
            top=top,
            inputs=model.inputs,
            top_input=model.top_input,
            head_boundary=model.head_boundary,
            label_party=model.label_party,
            join=model.join,
            batch_size=config.batch_size,
            max_records={p.hospital.slug: p.test_samples for p in parts},
            num_classes=description.num_classes,
            task=description.task,
            predict=predict,
        )
        round_ = evaluation_round(job.rounds, parts[0].evaluation.attempt)
        bounds = limits_of_job(job)
        channel = RedisChannel(
            options["WORKER_REDIS_URL"],
            max_message_bytes=bounds.frame_bytes,
            max_backlog_bytes=bounds.stream_bytes,
        )
        keys = relay_keys()
        renewed = [time.monotonic()]

        def interrupted() -> bool:
            renew = time.monotonic() - renewed[0] >= lease / 3
            answers = [
                evaluation_directive(part_id=p.pk, runner=runner, lease_seconds=lease, renew=renew)
                for p in parts
            ]
            if renew:
                renewed[0] = time.monotonic()
            return any(a != Directive.RUN for a in answers)

        logger.info("joint %s of job %s: served by %s for %s", what, job.pk, runner, slugs)
        served = serve_vertical_evaluation(
            channel=channel,
            streams={p.hospital.slug: keys.streams(config.job, p.hospital.slug) for p in parts},
            ids={
                p.hospital.slug: TurnIds(config.job, round_, p.position, config.mode, config.codec)
                for p in parts
            },
            server=server,
            silence_timeout=options["TURN_SILENCE_SECONDS"],
            max_frame_bytes=bounds.frame_bytes,
            interrupted=interrupted,
        )
        if served.figures is None and not served.predicted:
            ended = [
                p for p in parts if HospitalEvaluation.objects.get(pk=p.pk).status != "running"
            ]
            why = served.refused
            if why == "interrupted" and ended:
                why = f"{ended[0].hospital.slug}'s part of the {what} ended"
            fail_all(f"the joint {what} stopped: {why}")
            return EvaluationRun("failed", job.pk)
        bytes_up = {p.pk: served.counters[p.hospital.slug].bytes_in for p in parts}
        bytes_down = {p.pk: served.counters[p.hospital.slug].bytes_out for p in parts}
        if predict:
            prediction_finish(
                parts=parts, records=served.records, bytes_up=bytes_up, bytes_down=bytes_down
            )
            return EvaluationRun("completed", job.pk)
        assert served.figures is not None
        label = parts[0]
        evaluation_finish_joint(
            parts=parts,
            label_part=label,
            metrics=evaluation_results(served.figures),
            records=served.records,
            bytes_up=bytes_up,
            bytes_down=bytes_down,
        )
        return EvaluationRun("completed", job.pk)
    except Exception as e:  # every failure ends somewhere
        if classify(e) == FailureKind.INFRASTRUCTURE:
            logger.warning("joint evaluation of job %s: infrastructure failure: %s", job.pk, e)
            return EvaluationRun("retry", job.pk, retry=True)
        logger.warning("joint evaluation of job %s failed: %s", job.pk, e)
        fail_all(f"{type(e).__name__}: {e}")
        return EvaluationRun("failed", job.pk)
    finally:
        if channel is not None:
            channel.close()


class EvaluationHooks:
    """The coordinator's side of an evaluation: the lease renewed every third of its
    length, the figures recorded at the end (no progress rows: nothing trains)."""

    def __init__(self, *, part: HospitalEvaluation, runner: str, lease_seconds: float) -> None:
        self.part = part
        self.runner = runner
        self.lease_seconds = lease_seconds
        self._renewed = time.monotonic()

    def directive(self) -> Directive:
        renew = time.monotonic() - self._renewed >= self.lease_seconds / 3
        answer = evaluation_directive(
            part_id=self.part.pk, runner=self.runner, lease_seconds=self.lease_seconds, renew=renew
        )
        if renew:
            self._renewed = time.monotonic()
        return answer

    def progress(self, progress: TurnProgress) -> None:  # never called: no training step
        return None

    def resumed(self, step: int, reason: str) -> None:
        logger.info("evaluation %s goes on from test batch %d: %s", self.part.pk, step, reason)

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        try:
            evaluation_finish(
                part=self.part,
                metrics=evaluation_results(metrics),
                bytes_up=progress.bytes_up,
                bytes_down=progress.bytes_down,
            )
        except Exception as e:  # InvalidInput, Conflict: the hospital's figures refused
            raise TurnFailed(f"the coordinator refused the evaluation's figures: {e}") from e
