"""The server side of one hospital's inference request, run by a worker on the inference
queue: claim it, take the job's final server segment (kept loaded between requests),
answer the hospital's batches over the relay (``medsplit.turns.inference``), record how
it ended as counts and sizes.

The server segment is only read: it runs in eval mode without gradients and its state
is never saved. A worker keeps the last ``MEDSPLIT["INFERENCE_CACHE_SIZE"]`` jobs'
segments loaded (``functools.lru_cache``), keyed by the job and its final server
checkpoint, so a job's next request costs no model building and no checkpoint read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
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


def segment_of(job: Job) -> Segment:
    """``job``'s final server segment, loaded once per (job, final checkpoint) while it is
    among this process's last ``MEDSPLIT["INFERENCE_CACHE_SIZE"]`` (a completed job's
    final checkpoint cannot change, but the key would say so)."""
    row = Job.objects.select_related("server_checkpoint").get(pk=job.pk).server_checkpoint
    if row is None:  # a job that trained no step: its fresh segment
        return _segments()(job.pk, "", FRESH)
    return _segments()(job.pk, row.path, row.sha256)


def segment_loads() -> int:
    """How many segments this process has loaded (not found kept) since it started or
    :func:`forget_segments`."""
    return _segments().cache_info().misses


def forget_segments() -> None:
    """Drop every kept segment (and read the cache's size again at the next request)."""
    _segments.cache_clear()


@functools.cache
def _segments() -> Callable[[int, str, str], Segment]:
    # Sized by the setting when first used, not at import.
    return functools.lru_cache(maxsize=settings.MEDSPLIT["INFERENCE_CACHE_SIZE"])(_load)


def _load(job_id: int, path: str, sha256: str) -> Segment:
    job = Job.objects.get(pk=job_id)
    require_mode(job.mode, setting=EXTRA_MODES_SETTING)
    config = job.training_config()
    description = job.job_description()
    split = cached_split(job_model(job), config.cuts)
    party = server_party(split, config)
    if sha256 != FRESH:
        import_parties(read_verified(checkpoint_dir() / path, sha256), {SERVER_PARTY: party})
    party.module.eval()
    return Segment(
        config=config,
        split=split,
        party=party,
        num_classes=description.num_classes,
        label_shape=tuple(description.label_shape),
    )


def run(request_id: int, *, runner: str) -> str:
    """Claim inference request ``request_id`` and serve it; returns how it ended."""
    request = inference_claim(request_id=request_id, runner=runner)
    if request is None:
        return "not claimed"
    job = request.job
    channel: RedisChannel | None = None
    try:
        segment = segment_of(job)
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
