"""Each worker's own Prometheus metrics: steps served, bytes at the cut, turn runs by
outcome, step durations and turns in progress.

They are counted where the work happens (:class:`TurnMeter`, around
:func:`workers.turn_runner.run`) and served over HTTP by the worker's main process when
``MEDSPLIT_WORKER_METRICS_PORT`` is set (see :func:`serve`, started from
``workers/celery_app.py``). With the prefork pool the turns run in child processes:
prometheus_client's multiprocess mode then keeps each process's values in files under
``PROMETHEUS_MULTIPROC_DIR``, which the main process adds up at every scrape.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import time
from types import TracebackType

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import Metric

from medsplit.turns import TurnProgress

logger = logging.getLogger(__name__)

STEPS = Counter("medsplit_worker_steps", "Training steps this worker served (re-done ones too).")
CUT_BYTES = Counter(
    "medsplit_worker_cut_bytes",
    "Bytes of frames this worker received (up, from hospitals) and sent (down) at the cut.",
    ["direction"],
)
TURN_RUNS = Counter(
    "medsplit_worker_turn_runs",
    "Runs of a turn's server side that ended, by outcome (error: an unexpected exception).",
    ["outcome"],
)
STEP_SECONDS = Histogram(
    "medsplit_worker_step_seconds",
    "Seconds between two training steps served in a row: the hospital's layers, the relay "
    "both ways and the worker's layers (the first step of a run is not timed).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
# livesum: a process that died (a killed pool child) stops counting at once.
TURNS_IN_PROGRESS = Gauge(
    "medsplit_worker_turns_in_progress",
    "Turns whose server side this worker is running now.",
    multiprocess_mode="livesum",
)

OUTCOMES = ("completed", "paused", "stopped", "failed", "error")
for _direction in ("up", "down"):  # every series from the start, at 0
    CUT_BYTES.labels(direction=_direction)
for _outcome in OUTCOMES:
    TURN_RUNS.labels(outcome=_outcome)


class TurnMeter:
    """Counts one run of a turn's server side; use it as a context manager around the run.

    Args:
        progress: the turn's counters, as the server updates them; bytes are counted from
            how much they grow during the run (frames of re-done work included).
    """

    def __init__(self, progress: TurnProgress) -> None:
        self.progress = progress
        self.outcome: str | None = None
        self._bytes_up = progress.bytes_up
        self._bytes_down = progress.bytes_down
        self._last_step: float | None = None

    def __enter__(self) -> TurnMeter:
        TURNS_IN_PROGRESS.inc()
        return self

    def step(self) -> None:
        """One training step was served."""
        now = time.monotonic()
        STEPS.inc()
        if self._last_step is not None:
            STEP_SECONDS.observe(now - self._last_step)
        self._last_step = now
        self._count_bytes()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._count_bytes()
        TURNS_IN_PROGRESS.dec()
        outcome = self.outcome if self.outcome in OUTCOMES and exc is None else "error"
        TURN_RUNS.labels(outcome=outcome).inc()

    def _count_bytes(self) -> None:
        up, down = self.progress.bytes_up, self.progress.bytes_down
        # max(): a counter never goes down, whatever a restored progress says.
        CUT_BYTES.labels(direction="up").inc(max(up - self._bytes_up, 0))
        CUT_BYTES.labels(direction="down").inc(max(down - self._bytes_down, 0))
        self._bytes_up, self._bytes_down = max(up, self._bytes_up), max(down, self._bytes_down)


def multiprocess_dir() -> str | None:
    """Where the processes of this worker keep their values, if in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _LiveProcessesCollector(multiprocess.MultiProcessCollector):
    """Adds up every process's files; first forgets the live gauges of processes that
    died without saying so (a pool child killed by SIGKILL or the OOM killer)."""

    def collect(self) -> list[Metric]:
        forget_dead_processes(self._path)
        return super().collect()


_LIVE_FILE = re.compile(r"^gauge_live\w+_(\d+)\.db$")


def forget_dead_processes(path: str) -> None:
    """Remove the live-gauge files of processes that no longer exist."""
    pids = {
        int(m.group(1))
        for name in glob.glob(os.path.join(path, "gauge_live*.db"))
        if (m := _LIVE_FILE.match(os.path.basename(name)))
    }
    for pid in pids:
        if not _alive(pid):
            multiprocess.mark_process_dead(pid, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def forget_process(pid: int) -> None:
    """A pool process is exiting: its live gauges stop counting (multiprocess mode)."""
    path = multiprocess_dir()
    if path is not None:
        multiprocess.mark_process_dead(pid, path)


def serve(port: int, address: str) -> None:
    """Serve this worker's metrics at ``http://<address>:<port>/metrics``, from a thread.

    In multiprocess mode the values of every process of the worker are added up; else
    they are this process's own (solo or threads pool).
    """
    path = multiprocess_dir()
    if path is None:
        registry = REGISTRY
    else:
        registry = CollectorRegistry(auto_describe=False)
        _LiveProcessesCollector(registry, path=path)
    start_http_server(port, addr=address, registry=registry)
    logger.info(
        "worker metrics at http://%s:%d/metrics%s",
        address,
        port,
        f" (processes' values in {path})" if path else "",
    )
