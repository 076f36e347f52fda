"""Fixtures and test order of the whole suite.

The suite runs in one process (what CI runs); given ``-n 2`` (pytest-xdist), a file at
a time on one of two: the files with the most slow tests go first, since most of their
time is spent waiting on real processes, and the many quick files fill in beside and
after them, so that neither process is left with a long file at the end.

Every test starts with an empty cache, and every test session uses a relay prefix of its
own (``MEDSPLIT_RELAY_PREFIX``), so that the suite, a benchmark and a demo sharing one
Redis never meet each other's keys; the session's keys are removed when it ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.redis_cluster import redis_cluster  # noqa: F401 - one cluster for the session
from tests.redis_server import DEFAULT_URL, reachable


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On several processes (``-n 2``), the files with the most ``slow`` tests first, each
    file's tests in their own order, so that the long idle files start first (give
    ``--no-loadscope-reorder`` too: xdist hands the files out in this order). In one
    process, pytest's own order."""
    if not (getattr(config, "workerinput", None) or config.getoption("numprocesses", None)):
        return
    slow: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first_seen.setdefault(path, index)
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)

    def place(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        return -slow[path], first_seen[path]

    items.sort(key=place)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _torch_threads_as_found() -> Iterator[None]:
    """A test that changes this process's torch thread count (a benchmark's ``main()``
    run in process sets it) gives it back. The exactness tests compare weights trained by
    agent and worker processes, which start with the machine's default, with a reference
    trained here, and a convolution's gradients are summed in another order on another
    thread count: one thread against two changes ``conv1.conv.weight`` of small_cnn
    (``tests/workers/test_torch_threads.py``)."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Throttle counters and cached cut tables live in the cache, keyed by ids that every
    test database hands out again (person 1, job 1): each test starts with none."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(scope="session", autouse=True)
def _relay_prefix_of_this_session() -> Iterator[str]:
    from django.conf import settings

    from medsplit.channel import RelayKeys

    prefix = f"test-{uuid.uuid4().hex[:10]}"
    before = settings.MEDSPLIT["RELAY_PREFIX"]
    celery = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    celery_before = celery["global_keyprefix"]
    settings.MEDSPLIT["RELAY_PREFIX"] = prefix
    celery["global_keyprefix"] = RelayKeys(prefix).celery_prefix()  # in place: Celery's too
    os.environ["MEDSPLIT_RELAY_PREFIX"] = prefix  # the worker and agent processes' too
    yield prefix
    settings.MEDSPLIT["RELAY_PREFIX"] = before
    celery["global_keyprefix"] = celery_before
    url = os.environ.get("REDIS_URL", DEFAULT_URL)
    if reachable(url):
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                client.delete(key)
        finally:
            client.close()


@pytest.fixture(scope="session", autouse=True)
def _live_server_without_nagle() -> Iterator[None]:
    """The tests' live server answers as ``manage.py runserver`` does: without Nagle's
    40 ms wait on a kept-alive connection (coordinator/dev_server.py), which every agent
    request to it paid."""
    from django.test.testcases import LiveServerThread

    from coordinator.dev_server import NoDelayThreadedWSGIServer

    before = LiveServerThread.server_class
    LiveServerThread.server_class = NoDelayThreadedWSGIServer
    yield
    LiveServerThread.server_class = before
