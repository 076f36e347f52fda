"""The server side of one hospital's inference request, run by a worker on the inference
queue: claim it, take the job's final server segment (kept loaded between requests),
answer the hospital's batches over the relay (``medsplit.turns.inference``), record how
it ended as counts and sizes.

The server segment is only read: it runs in eval mode without gradients and its state
is never saved. A worker keeps the last ``MEDSPLIT["INFERENCE_CACHE_SIZE"]`` jobs'
segments loaded, keyed by the job and the sha256 of its final server checkpoint, so a
job's next request costs no model building and no checkpoint read.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from django.conf import settings

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.cutting import SplitModel
from medsplit.modes import require_mode
from medsplit.protocol.handoff import import_parties
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.setup import cached_split, server_party
from medsplit.turns import TurnIds
from medsplit.turns.inference import (
    INFERENCE_TOPIC,
    inference_limits,
    inference_round,
    serve_inference,
)
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from training.inference import inference_claim, inference_finish
from training.models import Job
from training.runs import checkpoint_dir
from workers.relay_watch import limits_of_job
from workers.turn_runner import EXTRA_MODES_SETTING, job_model

logger = logging.getLogger(__name__)

#: The key of a job that trained no step (its final server segment is the fresh one).
FRESH = "fresh"


@dataclass(frozen=True)
class Segment:
    """A job's final server segment, loaded: what a request is served with."""

    config: TrainingConfig
    split: SplitModel
    party: Party
    num_classes: int | None
    label_shape: tuple[int, ...]


class SegmentCache:
    """The last ``size`` jobs' final server segments, by (job, checkpoint sha256): a job
    whose final checkpoint changed (it cannot once completed, but a key says so) is
    loaded again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: OrderedDict[tuple[int, str], Segment] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, job: Job) -> Segment:
        row = Job.objects.select_related("server_checkpoint").get(pk=job.pk).server_checkpoint
        key = (job.pk, row.sha256 if row is not None else FRESH)
        with self._lock:
            if key in self._held:
                self._held.move_to_end(key)
                return self._held[key]
        segment = _load(job, None if row is None else (row.path, row.sha256))
        with self._lock:
            self._held[key] = segment
            self._held.move_to_end(key)
            while len(self._held) > self.size:
                self._held.popitem(last=False)
            self.loads += 1
        return segment


def _load(job: Job, checkpoint: tuple[str, str] | None) -> Segment:
    require_mode(job.mode, setting=EXTRA_MODES_SETTING)
    config = job.training_config()
    description = job.job_description()
    split = cached_split(job_model(job), config.cuts)
    party = server_party(split, config)
    if checkpoint is not None:  # else a job that trained no step: its fresh segment
        path, sha256 = checkpoint
        import_parties(read_verified(checkpoint_dir() / path, sha256), {SERVER_PARTY: party})
    party.module.eval()
    return Segment(
        config=config,
        split=split,
        party=party,
        num_classes=description.num_classes,
        label_shape=tuple(description.label_shape),
    )


_cache: SegmentCache | None = None


def segment_cache() -> SegmentCache:
    """This worker process's cache (sized by the setting when first used)."""
    global _cache
    if _cache is None:
        _cache = SegmentCache(settings.MEDSPLIT["INFERENCE_CACHE_SIZE"])
    return _cache


def run(request_id: int, *, runner: str) -> str:
    """Claim inference request ``request_id`` and serve it; returns how it ended."""
    request = inference_claim(request_id=request_id, runner=runner)
    if request is None:
        return "not claimed"
    job = request.job
    channel: RedisChannel | None = None
    try:
        segment = segment_cache().get(job)
        config = segment.config
        bounds = limits_of_job(job)
        channel = RedisChannel(
            settings.MEDSPLIT["WORKER_REDIS_URL"],
            max_message_bytes=bounds.frame_bytes,
            max_backlog_bytes=bounds.stream_bytes,
        )
        served = serve_inference(
            channel=channel,
            streams=relay_keys().streams(config.job, request.hospital.slug, INFERENCE_TOPIC),
            ids=TurnIds(
                config.job,
                inference_round(request.pk),
                request.position,
                config.mode,
                config.codec,
            ),
            mode=config.split_mode,
            split=segment.split,
            party=segment.party,
            limits=inference_limits(
                serving_batch=request.serving_batch,
                samples=request.samples,
                num_classes=segment.num_classes,
                label_shape=segment.label_shape,
            ),
            silence_timeout=settings.MEDSPLIT["TURN_SILENCE_SECONDS"],
            max_frame_bytes=bounds.frame_bytes,
        )
        counters = served.counters
        assert counters is not None
        reason = f"{request.hospital.slug}: {served.refused}" if served.refused else ""
        inference_finish(
            request=request,
            batches=served.batches,
            bytes_up=counters.bytes_in,
            bytes_down=counters.bytes_out,
            reason=reason,
        )
        logger.info(
            "inference %s of job %s at %s: %d batches, %d images%s",
            request.pk,
            job.pk,
            request.hospital.slug,
            served.batches,
            served.samples,
            f"; refused: {reason}" if reason else "",
        )
        return "failed" if reason else "completed"
    except Exception as e:  # every failure ends somewhere: the agent asks again
        logger.warning("inference %s failed: %s: %s", request_id, type(e).__name__, e)
        inference_finish(
            request=request, batches=0, bytes_up=0, bytes_down=0, reason=f"{type(e).__name__}: {e}"
        )
        return "failed"
    finally:
        if channel is not None:
            channel.close()
