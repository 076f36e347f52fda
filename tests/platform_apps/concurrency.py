"""Running a service from several threads at once, for tests of row locks."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections

from kernel.errors import PlatformError


def race(attempt: Callable[[], object], n: int = 2) -> list[object]:
    """Run ``attempt`` in ``n`` threads released together; their results or errors."""
    barrier = threading.Barrier(n)
    results: list[object] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait()
            outcome = attempt()
        except PlatformError as e:
            outcome = e
        finally:
            connections.close_all()  # this thread's connection
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == n, "a racing call did not finish"
    return results
