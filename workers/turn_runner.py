"""The server side of one turn, run by a worker: claim the turn, load the server segment
from the last checkpoint, serve the hospital over the relay, record what happened.

The protocol itself is :class:`medsplit.turns.TurnServer`; this module connects it to the
coordinator's database (leases, progress, checkpoints, the turn's end).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.conf import settings

from kernel.errors import Conflict
from medsplit.channel import StreamPair
from medsplit.channel.redis import RedisChannel
from medsplit.errors import MedSplitError
from medsplit.protocol.handoff import export_parties
from medsplit.training.setup import JobModel, cached_split, server_party
from medsplit.turns import Directive, TurnFailed, TurnIds, TurnProgress, TurnServer
from medsplit.turns.checkpoints import BASE, CheckpointStore, read_verified, write_atomic
from medsplit.turns.server import SERVER_PARTY
from training.models import Job, Turn
from training.runs import (
    checkpoint_dir,
    checkpoint_path,
    checkpoint_record,
    checkpoints_of_place,
    turn_claim,
    turn_complete,
    turn_directive,
    turn_release,
)
from training.services import turn_fail, turn_record_progress
from workers.metrics import TurnMeter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """How a run ended; ``advance``: the scheduler should move the job on."""

    outcome: str
    job_id: int | None = None
    advance: bool = False


def job_model(job: Job) -> JobModel:
    return JobModel(
        name=job.model_name,
        spatial_dims=job.spatial_dims,
        in_channels=job.in_channels,
        num_classes=job.num_classes,
        input_shape=tuple(job.input_shape),
        seed=job.seed,
    )


def run(turn_id: int, *, runner: str) -> RunResult:
    """Claim turn ``turn_id`` and serve it until it completes, pauses, stops or fails."""
    options = settings.MEDSPLIT
    lease = options["TURN_LEASE_SECONDS"]
    claim = turn_claim(turn_id=turn_id, runner=runner, lease_seconds=lease)
    if claim is None:
        logger.info("turn %s: not running or held by another worker; nothing to do", turn_id)
        return RunResult("not claimed")
    job, turn = claim.job, claim.turn
    config = job.training_config()
    split = cached_split(job_model(job), config.cuts)
    ids = TurnIds(config.job, claim.round_index, turn.position, config.mode, config.codec)
    store = DatabaseCheckpointStore(
        turn=turn,
        round_index=claim.round_index,
        initial=lambda: export_parties({SERVER_PARTY: server_party(split, config)}),
    )
    # The server updates this object in place; the meter reads the bytes off it.
    progress = TurnProgress(bytes_up=turn.bytes_up, bytes_down=turn.bytes_down)
    meter = TurnMeter(progress)
    hooks = RunnerHooks(turn=turn, runner=runner, lease_seconds=lease, meter=meter)
    channel = RedisChannel(options["WORKER_REDIS_URL"])
    logger.info(
        "turn %s (job %s, round %s, %s): served by %s",
        turn.pk,
        job.pk,
        claim.round_index,
        turn.hospital.slug,
        runner,
    )
    with meter:
        try:
            server = TurnServer(
                ids=ids,
                channel=channel,
                streams=StreamPair.for_hospital(config.job, turn.hospital.slug),
                split=split,
                party=server_party(split, config),
                store=store,
                hooks=hooks,
                batch_size=config.batch_size,
                checkpoint_every=options["CHECKPOINT_EVERY"],
                silence_timeout=options["TURN_SILENCE_SECONDS"],
                initial=progress,
                # After a crash or a failed attempt, stale frames and counters may be left.
                reset_streams=claim.taken_over or turn.attempt > 1,
            )
            outcome = server.run()
        except MedSplitError as e:
            result = _failed(turn, runner, lease, e)
        else:
            result = RunResult(outcome.value, job.pk, advance=outcome.value == "completed")
        finally:
            turn_release(turn_id=turn.pk, runner=runner)
            channel.close()
        meter.outcome = result.outcome
    return result


def _failed(turn: Turn, runner: str, lease: float, error: Exception) -> RunResult:
    if turn_directive(turn_id=turn.pk, runner=runner, lease_seconds=lease, renew=False) == (
        Directive.STOP
    ):
        # Not ours any more (cancelled, or taken over): whoever holds it decides.
        logger.warning("turn %s ended on %s after it was taken away: %s", turn.pk, runner, error)
        return RunResult("stopped", turn.job_id)
    reason = f"{type(error).__name__}: {error}"
    logger.warning("turn %s failed: %s", turn.pk, reason)
    turn_fail(turn=turn, reason=reason)
    return RunResult("failed", turn.job_id, advance=True)


class RunnerHooks:
    """The coordinator's side of a running turn, with bounded database traffic: the lease
    is renewed every third of its length, progress is stored at most every
    ``MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]`` (and at the end)."""

    def __init__(
        self, *, turn: Turn, runner: str, lease_seconds: float, meter: TurnMeter | None = None
    ) -> None:
        self.turn = turn
        self.runner = runner
        self.lease_seconds = lease_seconds
        self.meter = meter
        self.interval = settings.MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]
        self._renewed = time.monotonic()
        self._reported = float("-inf")

    def directive(self) -> Directive:
        renew = time.monotonic() - self._renewed >= self.lease_seconds / 3
        answer = turn_directive(
            turn_id=self.turn.pk, runner=self.runner, lease_seconds=self.lease_seconds, renew=renew
        )
        if renew:
            self._renewed = time.monotonic()
        return answer

    def progress(self, progress: TurnProgress) -> None:
        if self.meter is not None:  # once per step served: this worker's own metrics
            self.meter.step()
        if time.monotonic() - self._reported >= self.interval:
            self._record(progress, final=False)

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        self._record(progress, final=True)
        try:
            turn_complete(turn=self.turn, metrics=dict(metrics), crossed=progress.crossed)
        except Conflict as e:
            raise TurnFailed(f"the coordinator refused to finish the turn: {e}") from e

    def _record(self, progress: TurnProgress, *, final: bool) -> None:
        self._reported = time.monotonic()
        try:
            turn_record_progress(
                turn=self.turn,
                steps=progress.steps,
                samples=progress.samples,
                bytes_up=progress.bytes_up,
                bytes_down=progress.bytes_down,
                loss=progress.loss,
                final=final,
            )
        except Conflict as e:  # cancelled meanwhile: the next directive says stop
            logger.info("turn %s: progress not recorded: %s", self.turn.pk, e)


class DatabaseCheckpointStore(CheckpointStore):
    """Checkpoints of one turn's place as files under ``MEDSPLIT["CHECKPOINT_DIR"]``, each
    with its database row; ``-1`` is where the job's last completed turn left the server."""

    def __init__(self, *, turn: Turn, round_index: int, initial: Callable[[], bytes]) -> None:
        self.turn = turn
        self.round_index = round_index
        self.initial = initial

    def _place(self):
        return checkpoints_of_place(
            job_id=self.turn.job_id, round_index=self.round_index, position=self.turn.position
        )

    def steps(self) -> list[int]:
        return [BASE, *self._place().values_list("step", flat=True)]

    def load(self, step: int) -> bytes:
        if step == BASE:
            job = Job.objects.select_related("server_checkpoint").get(pk=self.turn.job_id)
            row = job.server_checkpoint
            if row is None:
                return self.initial()
        else:
            row = self._place().get(step=step)
        return read_verified(checkpoint_dir() / row.path, row.sha256)

    def save(self, step: int, data: bytes) -> None:
        path = checkpoint_path(
            job_id=self.turn.job_id,
            round_index=self.round_index,
            position=self.turn.position,
            step=step,
        )
        digest = write_atomic(checkpoint_dir() / path, data)
        checkpoint_record(
            turn=self.turn,
            round_index=self.round_index,
            step=step,
            path=path,
            sha256=digest,
            size_bytes=len(data),
        )
