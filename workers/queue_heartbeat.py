"""Each worker says which queues it consumes, so that a queue nobody consumes shows.

A job whose turns go to a queue that no live worker reads sits "scheduled" forever
without a word (it happened: a worker that could not start under its Redis user). So the
main process of every worker sets one key per queue it consumes,
``<prefix>:worker:queue:<queue>:<worker>``, every :data:`INTERVAL_SECONDS`, with a time to
live of three intervals; the coordinator's overview and ``/metrics`` count the live ones
(``monitoring.collectors.queue_consumers``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import redis

from medsplit.channel.connect import connect
from medsplit.channel.keys import RelayKeys

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 10.0
TTL_SECONDS = int(3 * INTERVAL_SECONDS)


class QueueHeartbeat:
    """Beats for ``worker`` on ``queues`` in a daemon thread until :meth:`stop`."""

    def __init__(self, *, url: str, keys: RelayKeys, worker: str, queues: Sequence[str]) -> None:
        self.keys = keys
        self.worker = worker
        self.queues = list(queues)
        self._client = connect(url, socket_timeout=5, socket_connect_timeout=5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-heartbeat", daemon=True)

    def start(self) -> QueueHeartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.set(self.keys.worker_queue(queue, self.worker), "1", ex=TTL_SECONDS)
        pipe.execute()

    def stop(self) -> None:
        """Stop, and take this worker's keys away at once (it no longer consumes)."""
        self._stop.set()
        try:
            self._client.delete(*(self.keys.worker_queue(q, self.worker) for q in self.queues))
        except redis.RedisError as e:
            logger.info("queue heartbeat: could not remove its keys: %s", e)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except redis.RedisError as e:
                # The relay away: the keys expire, the overview says so; try again.
                logger.warning("queue heartbeat: %s", e)
            self._stop.wait(INTERVAL_SECONDS)
