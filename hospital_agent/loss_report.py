"""The hospital's own training loss, reported to the coordinator while its turn runs.

In a mode whose labels stay at the hospital (U-shaped) the loss is computed here, so the
worker cannot report it and the dashboard would show none. The agent tells the
coordinator its latest loss, a single number, about once a second and after its last
training step; nothing else (no labels, no logits, no per-sample values). A hospital that
prefers not to sets ``report_loss = false``.

Reports go from a thread of their own, so a slow or absent coordinator never holds up a
training step; a report that fails is dropped (the next one says more).
"""

from __future__ import annotations

import logging
import math
import threading

from hospital_agent.coordinator import Coordinator, CoordinatorError

logger = logging.getLogger(__name__)

#: Seconds between reports (the coordinator keeps a metric point about once a second).
REPORT_SECONDS = 1.0


class LossReporter:
    """Sends the latest ``(step, loss)`` of one turn, at most every ``interval`` seconds.

    Args:
        coordinator: the agent's coordinator client.
        job, turn: the running turn's job and id (as the assignment gives them).
        last_step: the turn's last training step (counted from 1): reported at once.
        interval: seconds between reports.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        job: int,
        turn: int,
        last_step: int,
        interval: float = REPORT_SECONDS,
    ) -> None:
        self.coordinator = coordinator
        self.job, self.turn, self.last_step = job, turn, last_step
        self.interval = interval
        self._latest: tuple[int, float] | None = None
        self._sent: tuple[int, float] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loss-report", daemon=True)
        self._thread.start()

    def saw(self, step: int, loss: float) -> None:
        """A training step finished (``step`` counted from 1) with ``loss``."""
        if not math.isfinite(loss):
            return  # the worker's checks and the turn's failure say more than a NaN
        with self._lock:
            self._latest = (step, float(loss))
        if step >= self.last_step:
            self._wake.set()

    def close(self, timeout: float = 3.0) -> None:
        """Send what is left, then stop (waiting at most ``timeout`` seconds)."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            self._send()
            if self._closed.is_set():
                return

    def _send(self) -> None:
        with self._lock:
            latest = self._latest
        if latest is None or latest == self._sent:
            return
        step, loss = latest
        try:
            self.coordinator.report_loss(job=self.job, turn=self.turn, step=step, loss=loss)
        except CoordinatorError as e:
            logger.debug("job %s: loss of step %s not reported: %s", self.job, step, e)
        self._sent = latest
