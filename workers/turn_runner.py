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

from hospitals.models import Hospital
from hospitals.relay_acl import relay_keys
from hospitals.relay_services import relay_user_suspend
from kernel.actors import Actor
from kernel.errors import Conflict
from medsplit.channel.redis import RedisChannel
from medsplit.errors import MedSplitError
from medsplit.models import require_model_module
from medsplit.modes import StartFrom, get_mode, require_mode
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel, cached_split, server_party
from medsplit.turns import (
    Directive,
    RelayOverused,
    TurnFailed,
    TurnIds,
    TurnProgress,
    TurnServer,
)
from medsplit.turns.checkpoints import BASE
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import StateStore, StoreError, read_verified, write_atomic
from training.models import Job, Turn
from training.plan import turn_start
from training.runs import (
    checkpoint_dir,
    checkpoint_path,
    checkpoint_record,
    checkpoints_of_place,
    last_retry_reason,
    turn_claim,
    turn_complete,
    turn_directive,
    turn_release,
    turn_resumed_noted,
    turn_retry_noted,
)
from training.services import turn_fail, turn_record_progress
from workers.failures import FailureKind, backoff, classify, max_runs
from workers.metrics import TurnMeter
from workers.relay_guard import RelayGuard
from workers.relay_watch import guard as relay_guard
from workers.relay_watch import limits_of_job

logger = logging.getLogger(__name__)

#: Where the workers' configuration adds modes, for the message of an unknown one.
EXTRA_MODES_SETTING = 'MEDSPLIT["EXTRA_MODES"] (MEDSPLIT_EXTRA_MODES)'


@dataclass(frozen=True)
class RunResult:
    """How a run ended; ``advance``: the scheduler should move the job on; ``retry_in``:
    run the turn again after this many seconds (an infrastructure failure)."""

    outcome: str
    job_id: int | None = None
    advance: bool = False
    retry_in: float | None = None


def job_model(job: Job) -> JobModel:
    """The job's model, from its stored description (``JobDescription.from_json``).

    Raises:
        ModelModuleRefused: a ``MODULE:FACTORY`` model whose module this worker does not
            list in ``MEDSPLIT["MODEL_MODULES"]``; nothing of it was imported.
    """
    model = job.job_description().job_model()
    require_model_module(model.name)  # JobModel.build checks too; this says so first
    return model


def reported_limits(job: Job, config: TrainingConfig, hospital: Hospital) -> FrameLimits:
    """What the hospital's frames may hold this turn: the job's batch and classes, and the
    steps its reported split sizes give (``dataset_summary["split_sizes"]``).

    Raises:
        TurnFailed: the hospital reported no usable split sizes.
    """
    sizes = (hospital.dataset_summary or {}).get("split_sizes")
    counts = [sizes.get(part) if isinstance(sizes, dict) else None for part in ("train", "val")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise TurnFailed(
            f"hospital {hospital.slug} has reported no split sizes (its dataset summary holds "
            f"{sizes!r} for split_sizes), so its frames cannot be checked against its data; "
            "start its agent so that it reports them with a heartbeat"
        )
    train, val = counts
    description = job.job_description()
    return turn_limits(
        config,
        num_classes=description.num_classes,
        train=train,
        val=val,
        label_shape=description.label_shape,
    )


def run(turn_id: int, *, runner: str) -> RunResult:
    """Claim turn ``turn_id`` and serve it until it completes, pauses, stops or fails.

    Every exception ends in :func:`_ended`: an infrastructure failure gives the turn back
    to be run again later (``RunResult.retry_in``), anything else ends the attempt under
    the job's failure policy (``workers/failures.py``).
    """
    options = settings.MEDSPLIT
    lease = options["TURN_LEASE_SECONDS"]
    claim = turn_claim(turn_id=turn_id, runner=runner, lease_seconds=lease)
    if claim is None:
        logger.info("turn %s: not running or held by another worker; nothing to do", turn_id)
        return RunResult("not claimed")
    job, turn = claim.job, claim.turn
    cap = max_runs(job.max_retries)
    if turn.runs > cap:
        turn_release(turn_id=turn.pk, runner=runner)
        return _give_up(turn, cap)
    channel: RedisChannel | None = None
    hooks: RunnerHooks | None = None
    try:
        # Only a mode this worker was configured with runs (MEDSPLIT["EXTRA_MODES"]).
        require_mode(job.mode, setting=EXTRA_MODES_SETTING)
        config = job.training_config()
        split = cached_split(job_model(job), config.cuts)
        ids = TurnIds(config.job, claim.round_index, turn.position, config.mode, config.codec)
        store = DatabaseCheckpointStore(
            turn=turn,
            round_index=claim.round_index,
            fresh=lambda: {SERVER_PARTY: server_party(split, config)},
        )
        # The server updates this object in place; the meter reads the bytes off it.
        progress = TurnProgress(bytes_up=turn.bytes_up, bytes_down=turn.bytes_down)
        meter = TurnMeter(progress)
        # Read what the hospital sends with the job's bounds: an oversized frame is refused
        # from its first chunk, a flooded stream at the next read (workers/relay_guard.py).
        bounds = limits_of_job(job)
        channel = RedisChannel(
            options["WORKER_REDIS_URL"],
            max_message_bytes=bounds.frame_bytes,
            max_backlog_bytes=bounds.stream_bytes,
        )
        hooks = RunnerHooks(
            turn=turn,
            runner=runner,
            lease_seconds=lease,
            meter=meter,
            guard=relay_guard(),
            # The job's result, if this turn ends the job and its mode combines the last
            # group: made of the group's server checkpoints, as a further round would.
            combine=lambda blobs: config.split_mode.combine_exported(blobs, store.fresh),
        )
        logger.info(
            "turn %s (job %s, round %s, %s): served by %s (start %d of at most %d)",
            turn.pk,
            job.pk,
            claim.round_index,
            turn.hospital.slug,
            runner,
            turn.runs,
            cap,
        )
        with meter:
            try:
                server = TurnServer(
                    ids=ids,
                    channel=channel,
                    streams=relay_keys().streams(config.job, turn.hospital.slug),
                    split=split,
                    party=server_party(split, config),
                    store=store,
                    hooks=hooks,
                    limits=reported_limits(job, config, turn.hospital),
                    hospital=turn.hospital.slug,
                    checkpoint_every=options["CHECKPOINT_EVERY"],
                    silence_timeout=options["TURN_SILENCE_SECONDS"],
                    initial=progress,
                    # After a crash or a failed attempt, stale frames and counters may be left.
                    reset_streams=claim.taken_over or turn.attempt > 1,
                    mode=config.split_mode,
                )
                outcome = server.run()
                result = RunResult(outcome.value, job.pk, advance=outcome.value == "completed")
            except Exception as e:  # every failure ends somewhere: see the docstring
                result = _ended(turn, runner, lease, e)
            # The meter counts the run by how it ended, as it closes.
            meter.outcome = result.outcome
    except Exception as e:  # the set-up itself failed
        result = _ended(turn, runner, lease, e)
    finally:
        turn_release(turn_id=turn.pk, runner=runner)
        if channel is not None:
            channel.close()
        if hooks is not None and hooks.guard is not None:
            hooks.guard.client.close()
    return result


def _ended(turn: Turn, runner: str, lease: float, error: Exception) -> RunResult:
    if turn_directive(turn_id=turn.pk, runner=runner, lease_seconds=lease, renew=False) == (
        Directive.STOP
    ):
        # Not ours any more (cancelled, or taken over): whoever holds it decides.
        logger.warning("turn %s ended on %s after it was taken away: %s", turn.pk, runner, error)
        return RunResult("stopped", turn.job_id)
    reason = f"{type(error).__name__}: {error}"
    if classify(error) == FailureKind.INFRASTRUCTURE:
        wait = backoff(turn.runs)
        logger.warning(
            "turn %s: infrastructure failure, again in %.0f s: %s", turn.pk, wait, reason
        )
        turn_retry_noted(turn=turn, reason=reason, retry_in=wait)
        return RunResult("retry", turn.job_id, retry_in=wait)
    # A bug or an out-of-memory error gets its traceback in the log; a refusal its reason.
    unexpected = not isinstance(error, MedSplitError)
    logger.warning("turn %s failed: %s", turn.pk, reason, exc_info=unexpected)
    if isinstance(error, RelayOverused):
        # Before the turn fails, so that its retry cannot find the relay still full.
        relay_user_suspend(actor=Actor.system(), hospital=turn.hospital, reason=str(error))
    turn_fail(turn=turn, reason=reason)
    return RunResult("failed", turn.job_id, advance=True)


def _give_up(turn: Turn, cap: int) -> RunResult:
    """An attempt started more often than the cap allows fails, saying so."""
    last = last_retry_reason(turn=turn)
    reason = (
        f"the turn's server side was started {turn.runs} times without finishing, more than "
        f"the {cap} allowed (MEDSPLIT_TURN_MAX_RUNS, else the job's retries plus two)"
        + (f"; the last failure: {last}" if last else "")
    )
    logger.warning("turn %s: %s", turn.pk, reason)
    turn_fail(turn=turn, reason=reason)
    return RunResult("failed", turn.job_id, advance=True)


class RunnerHooks:
    """The coordinator's side of a running turn, with bounded database traffic: the lease
    is renewed every third of its length, progress is stored at most every
    ``MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]`` (and at the end)."""

    def __init__(
        self,
        *,
        turn: Turn,
        runner: str,
        lease_seconds: float,
        meter: TurnMeter | None = None,
        guard: RelayGuard | None = None,
        combine: Callable[[list[bytes]], bytes] | None = None,
    ) -> None:
        self.turn = turn
        self.combine = combine
        self.runner = runner
        self.lease_seconds = lease_seconds
        self.meter = meter
        self.guard = guard
        self.interval = settings.MEDSPLIT["METRICS_MIN_INTERVAL_SECONDS"]
        self.guard_interval = settings.MEDSPLIT["RELAY_GUARD_SECONDS"]
        self._renewed = time.monotonic()
        self._reported = float("-inf")
        self._guarded = time.monotonic()

    def directive(self) -> Directive:
        self._guard_relay()
        renew = time.monotonic() - self._renewed >= self.lease_seconds / 3
        answer = turn_directive(
            turn_id=self.turn.pk, runner=self.runner, lease_seconds=self.lease_seconds, renew=renew
        )
        if renew:
            self._renewed = time.monotonic()
        return answer

    def _guard_relay(self) -> None:
        """Now and then, measure what the hospital stores on the relay against its jobs'
        bounds (a flood of blobs "for" others, say, which its streams never show)."""
        if self.guard is None or time.monotonic() - self._guarded < self.guard_interval:
            return
        self._guarded = time.monotonic()
        overuse = self.guard.check(self.turn.hospital.slug)
        if overuse is not None:
            raise RelayOverused(overuse.reason())

    def progress(self, progress: TurnProgress) -> None:
        if self.meter is not None:  # once per step served: this worker's own metrics
            self.meter.step()
        if time.monotonic() - self._reported >= self.interval:
            self._record(progress, final=False)

    def resumed(self, step: int, reason: str) -> None:
        turn_resumed_noted(turn=self.turn, step=step, reason=reason, runner=self.runner)

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        self._record(progress, final=True)
        try:
            turn_complete(
                turn=self.turn,
                metrics=dict(metrics),
                crossed=progress.crossed,
                combine=self.combine,
            )
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


class DatabaseCheckpointStore(StateStore):
    """Checkpoints of one turn's place as files under ``MEDSPLIT["CHECKPOINT_DIR"]``, each
    with its database row; ``-1`` is where the turn's server segment starts, as the job's
    mode says (:func:`training.plan.turn_start`): where the job's last completed turn left
    the server (round-robin), the job's initial weights, or the combination of the last
    group's turns' ends (each of those turns trained its own copy of the segment)."""

    def __init__(
        self, *, turn: Turn, round_index: int, fresh: Callable[[], Mapping[str, Party]]
    ) -> None:
        self.turn = turn
        self.round_index = round_index
        self.fresh = fresh

    def initial(self) -> bytes:
        return export_parties(self.fresh())

    def _place(self):
        return checkpoints_of_place(
            job_id=self.turn.job_id, round_index=self.round_index, position=self.turn.position
        )

    def steps(self) -> list[int]:
        return [BASE, *self._place().values_list("step", flat=True)]

    def load(self, step: int) -> bytes:
        if step == BASE:
            return self._start()
        else:
            row = self._place().get(step=step)
        return read_verified(checkpoint_dir() / row.path, row.sha256)

    def _start(self) -> bytes:
        start = turn_start(turn=self.turn)
        if start.kind == StartFrom.INITIAL or not start.sources:
            return self.initial()
        if start.kind == StartFrom.AGGREGATE:
            ends = [
                checkpoints_of_place(
                    job_id=self.turn.job_id, round_index=t.round.index, position=t.position
                ).last()
                for t in start.sources
            ]
            pairs = zip(start.sources, ends, strict=True)
            missing = [t.hospital.slug for t, row in pairs if row is None]
            if missing:
                raise StoreError(
                    f"the server checkpoints this turn starts from (the ends of the turns of "
                    f"{', '.join(missing)}) are gone; the turn cannot start"
                )
            blobs = [read_verified(checkpoint_dir() / row.path, row.sha256) for row in ends]
            # Weighted by the secure aggregation's public weights, where the mode has one.
            return get_mode(self.turn.job.mode).combine_exported(blobs, self.fresh, start.weights)
        job = Job.objects.select_related("server_checkpoint").get(pk=self.turn.job_id)
        row = job.server_checkpoint
        if row is None:
            return self.initial()
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
