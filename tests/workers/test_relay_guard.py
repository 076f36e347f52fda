"""The workers' relay guard against a real Redis: what each key of a hospital may hold,
and what it costs to find out."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from medsplit.channel.keys import RelayKeys
from medsplit.training.relay_limits import KEY_OVERHEAD, RelayLimits
from workers.relay_guard import RelayGuard

LIMITS = RelayLimits(frame_bytes=1 << 20, stream_bytes=4 << 20, blob_bytes=1 << 16)


@pytest.fixture
def relay(redis_url: str) -> Iterator[tuple[redis.Redis, RelayKeys]]:
    client = redis.Redis.from_url(redis_url)
    keys = RelayKeys(f"test-guard-{uuid.uuid4().hex[:8]}")
    yield client, keys
    for key in client.scan_iter(match=keys.deployment_pattern()):
        client.delete(key)
    client.close()


def test_a_check_looks_up_each_job_s_bounds_once_however_many_keys_it_holds(relay) -> None:
    client, keys = relay
    # Hospital h1 sealed blobs for 30 others after each of 2 turns, in two jobs, and
    # wrote its streams in job 1; job 3 is not one of its jobs.
    for job in ("job-1", "job-2"):
        for turn in range(2):
            for other in range(30):
                client.set(
                    keys.mail(
                        job,
                        sender="h1",
                        recipient=f"o{other}",
                        topic=("handoff", "handoff-odd")[turn],
                    ),
                    b"x" * 512,
                )
    client.xadd(keys.streams("job-1", "h1").up, {"f": b"frame"})
    client.set(keys.mail("job-3", sender="h1", recipient="o1"), b"x" * 512)
    asked: Counter[str] = Counter()

    def limits_of(job: str, hospital: str) -> RelayLimits | None:
        asked[job] += 1
        return LIMITS if job in ("job-1", "job-2") and hospital == "h1" else None

    uses = RelayGuard(client, keys, limits_of).usage("h1")
    assert asked == {"job-1": 1, "job-2": 1, "job-3": 1}
    allowed = {use.key: use.allowed for use in uses}
    assert len(allowed) == 2 * 2 * 30 + 1 + 1
    assert allowed[keys.streams("job-1", "h1").up] == LIMITS.stream_bytes
    assert allowed[keys.mail("job-2", sender="h1", recipient="o7", topic="handoff-odd")] == (
        LIMITS.blob_bytes + KEY_OVERHEAD
    )
    assert allowed[keys.mail("job-3", sender="h1", recipient="o1")] == KEY_OVERHEAD
    assert not any(use.over for use in uses)
