"""The Celery app, configured from the coordinator's Django settings (``CELERY_*``)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The coordinator's apps live in platform/ (not an importable package: see docs/design.md).
_PLATFORM = Path(__file__).resolve().parent.parent / "platform"
if str(_PLATFORM) not in sys.path:
    sys.path.insert(0, str(_PLATFORM))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402


def _metrics_folder() -> None:
    """Turns run in the prefork pool's child processes and the main process serves the
    metrics: prometheus_client's multiprocess mode, chosen when it is first imported (just
    below), keeps each process's values in files in this folder. A fresh one per start,
    removed at exit, unless the operator names one (it must then be empty and this
    worker's own)."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="medsplit-worker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    owner = os.getpid()

    def remove() -> None:
        # Pool children leave with os._exit (no atexit); this is for any other fork.
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


if settings.MEDSPLIT["WORKER_METRICS_PORT"] is not None:
    _metrics_folder()

import torch  # noqa: E402
from celery import Celery, signals  # noqa: E402

from medsplit.channel.keys import RelayKeys  # noqa: E402
from medsplit.runtime import freeze_start_up, keep_freed_memory  # noqa: E402
from workers import metrics  # noqa: E402
from workers.queue_heartbeat import QueueHeartbeat  # noqa: E402

app = Celery("medsplit", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@signals.worker_init.connect
@signals.worker_process_init.connect
def prepare_torch(**_: object) -> None:
    """Deterministic kernels, so a job's weights equal unsplit training (invariant 1); a
    step's buffers reuse the last step's pages, and the start-up objects are out of the
    collector's walks (``medsplit.runtime``)."""
    keep_freed_memory()
    freeze_start_up()
    if settings.MEDSPLIT["DETERMINISTIC"]:
        torch.use_deterministic_algorithms(True)


@signals.worker_ready.connect
def serve_metrics(**_: object) -> None:
    """This worker's metrics on MEDSPLIT_WORKER_METRICS_PORT, from its main process."""
    port = settings.MEDSPLIT["WORKER_METRICS_PORT"]
    if port is not None:
        metrics.serve(port, settings.MEDSPLIT["WORKER_METRICS_ADDRESS"])


_heartbeats: list[QueueHeartbeat] = []


@signals.worker_ready.connect
def announce_queues(sender: object = None, **_: object) -> None:
    """Say, every few seconds, which queues this worker consumes (workers/queue_heartbeat.py)."""
    consumer = getattr(sender, "task_consumer", None)
    queues = [q.name for q in getattr(consumer, "queues", [])] or [
        settings.CELERY_TASK_DEFAULT_QUEUE
    ]
    hostname = getattr(sender, "hostname", None) or f"pid-{os.getpid()}"
    _heartbeats.append(
        QueueHeartbeat(
            url=settings.MEDSPLIT["WORKER_REDIS_URL"],
            keys=RelayKeys(settings.MEDSPLIT["RELAY_PREFIX"]),
            worker=hostname,
            queues=queues,
        ).start()
    )


@signals.worker_shutdown.connect
def stop_announcing(**_: object) -> None:
    while _heartbeats:
        _heartbeats.pop().stop()


@signals.worker_process_shutdown.connect
def forget_pool_process(pid: int | None = None, **_: object) -> None:
    """A pool child exiting: the turns it counted as in progress are not any more."""
    metrics.forget_process(pid or os.getpid())
