"""The server side of one hospital's evaluation of a completed job, run by a worker:
claim it, load the job's final server segment, serve the hospital's test batches over
the relay (``medsplit.turns.evaluation``), record its figures.

Nothing is written but the figures: the server segment starts from the job's final
checkpoint in memory and its state is never saved (an evaluation trains nothing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.modes import require_mode
from medsplit.protocol.handoff import export_parties
from medsplit.training.setup import cached_split, server_party
from medsplit.turns import Directive, TurnFailed, TurnIds, TurnProgress
from medsplit.turns.evaluation import (
    evaluation_limits,
    evaluation_results,
    evaluation_round,
    evaluation_server,
)
from medsplit.turns.stores import read_verified
from training.evaluation import (
    MAX_RUNS,
    evaluation_claim,
    evaluation_directive,
    evaluation_fail,
    evaluation_finish,
    evaluation_release,
)
from training.models import HospitalEvaluation, Job
from training.runs import checkpoint_dir
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
