"""The aggregator of a secure aggregation round, run by a worker: read every participant's
masked submission off the relay, sum them, put the aggregate back.

The worker holds no key and sees only masked ring vectors
(:class:`medsplit.secagg.Aggregator`); each submission is the one its hospital recorded
with the coordinator (its SHA-256), read from the stream only that hospital's relay user
may write. A refused submission fails the attempt naming the hospital, and nothing is
summed. When the attempt ends the job's last round, the job's server result (the
participants' server segments, weighted alike) is recorded with it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.errors import ChannelError, ChannelTimeout, MedSplitError
from medsplit.modes import GroupServer
from medsplit.secagg import Aggregator, RoundId, SubmissionRejected, VectorLayout
from medsplit.secagg.messages import MaskedSubmission
from medsplit.training.aggregate_state import aggregation_parts
from medsplit.training.setup import cached_split, client_parties, server_party
from medsplit.turns.server import SERVER_PARTY
from training.aggregation import (
    aggregation_claim,
    aggregation_done,
    aggregation_refused,
    aggregation_retry,
)
from training.runs import job_result_combine

logger = logging.getLogger(__name__)

#: How long the aggregator waits for a recorded submission to be readable on the relay.
READ_SECONDS = 30.0
#: A submission's header and framing beyond its 8-byte values.
_HEADER_BYTES = 8192


@dataclass(frozen=True)
class AggregationResult:
    """How a summing ended, and the job to move on (``None``: nothing was done)."""

    outcome: str
    job_id: int | None = None


def run(aggregation_id: int) -> AggregationResult:
    """Sum attempt ``aggregation_id`` if it is complete and not summed yet."""
    aggregation = aggregation_claim(aggregation_id=aggregation_id)
    if aggregation is None:
        return AggregationResult("not claimed")
    job = aggregation.job
    config = job.training_config()
    split = cached_split(job.job_description().job_model(), config.cuts)
    floats, _ = aggregation_parts(client_parties(split, config))
    length = VectorLayout.of(floats).length
    round_id = RoundId(
        config.job, aggregation.round_index, aggregation.attempt, aggregation.weights
    )
    keys = relay_keys()
    channel = RedisChannel(
        settings.MEDSPLIT["WORKER_REDIS_URL"], max_message_bytes=_HEADER_BYTES + 8 * length
    )
    try:
        aggregator = Aggregator(round_id, length)
        for hospital in round_id.participants:
            recorded = aggregation.submissions[hospital]["sha256"]
            data = _read_submission(channel, keys.streams(config.job, hospital, "agg").up, recorded)
            if data is None:
                raise SubmissionRejected(
                    f"the masked vector {hospital!r} recorded (sha256 {recorded[:16]}...) is "
                    f"not on its relay stream within {READ_SECONDS:.0f} s",
                    hospital=hospital,
                )
            aggregator.receive(data, hospital=hospital)
        aggregate = aggregator.aggregate().to_bytes()
        for hospital in round_id.participants:
            channel.send(keys.streams(config.job, hospital, "agg").down, aggregate)
        digest = hashlib.sha256(aggregate).hexdigest()
        fresh = lambda: {SERVER_PARTY: server_party(split, config)}  # noqa: E731
        with transaction.atomic():
            aggregation_done(
                aggregation_id=aggregation.pk, sha256=digest, size_bytes=len(aggregate)
            )
            # A shared segment's end is the result already (workers/group_runner.py).
            shared = config.split_mode.group_server() == GroupServer.SHARED
            if aggregation.round_index == job.rounds - 1 and not shared:
                job_result_combine(
                    job=job,
                    combine=lambda blobs, weights: config.split_mode.combine_exported(
                        blobs, fresh, weights
                    ),
                )
        logger.info(
            "job %s round %s attempt %s: aggregated %d masked submissions (%d bytes each)",
            job.pk,
            aggregation.round_index,
            aggregation.attempt,
            len(round_id.participants),
            len(aggregate),
        )
        return AggregationResult("done", job.pk)
    except SubmissionRejected as e:
        logger.warning("job %s: %s", job.pk, e)
        aggregation_refused(aggregation_id=aggregation.pk, hospital=e.hospital, reason=str(e))
        return AggregationResult("refused", job.pk)
    except (ChannelError, MedSplitError) as e:
        logger.warning("job %s: the aggregation failed, restarting it: %s", job.pk, e)
        aggregation_retry(aggregation_id=aggregation.pk, reason=f"{type(e).__name__}: {e}")
        return AggregationResult("restarted", job.pk)
    finally:
        channel.close()


def _read_submission(channel: RedisChannel, stream: str, sha256: str) -> bytes | None:
    """The message on ``stream`` whose SHA-256 is ``sha256``; older messages (of attempts
    that were restarted) are skipped; ``None`` if it does not come in time."""
    deadline = time.monotonic() + READ_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            data = channel.receive(stream, timeout=left)
        except ChannelTimeout:
            return None
        if hashlib.sha256(data).hexdigest() == sha256:
            return data
        try:
            stale = MaskedSubmission.from_bytes(data)
            logger.info(
                "%s: skipping a submission of round %s attempt %s",
                stream,
                stale.round,
                stale.attempt,
            )
        except MedSplitError:
            logger.info(
                "%s: skipping %d bytes that are not the recorded submission", stream, len(data)
            )
    return None
