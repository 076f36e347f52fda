"""The agent's loss reports (U-shaped: the loss is computed at the hospital): the latest
loss about once a second, the last step at once, nothing that is not finite, and a
coordinator that does not answer never holds up a step."""

from __future__ import annotations

import threading
import time

from hospital_agent.coordinator import CoordinatorUnreachable
from hospital_agent.loss_report import LossReporter


class Recording:
    """Stands in for the coordinator client: records each report (or fails, or hangs)."""

    def __init__(self, *, fail: bool = False, hang: threading.Event | None = None) -> None:
        self.sent: list[tuple[int, int, int, float]] = []
        self.fail, self.hang = fail, hang

    def report_loss(self, *, job: int, turn: int, step: int, loss: float) -> dict:
        if self.hang is not None:
            self.hang.wait(5)
        if self.fail:
            raise CoordinatorUnreachable("no answer")
        self.sent.append((job, turn, step, loss))
        return {}


def test_the_latest_loss_goes_about_once_a_second_and_the_last_step_at_once() -> None:
    coordinator = Recording()
    reporter = LossReporter(coordinator, job=3, turn=9, last_step=50, interval=0.2)
    for step in range(1, 40):
        reporter.saw(step, 1.0 / step)
    reporter.saw(40, float("nan"))  # not finite: not sent
    time.sleep(0.5)
    assert coordinator.sent[-1] == (3, 9, 39, 1.0 / 39)
    assert len(coordinator.sent) <= 3, "one report per interval, not one per step"
    reporter.saw(50, 0.125)
    deadline = time.monotonic() + 0.15  # well within the interval: sent at once
    while coordinator.sent[-1][2] != 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert coordinator.sent[-1] == (3, 9, 50, 0.125)
    reporter.close()
    assert [s for *_, s, _ in coordinator.sent].count(50) == 1, "nothing sent twice"


def test_a_coordinator_that_does_not_answer_holds_up_no_step() -> None:
    hang = threading.Event()
    coordinator = Recording(fail=True, hang=hang)
    reporter = LossReporter(coordinator, job=1, turn=1, last_step=5, interval=0.05)
    started = time.monotonic()
    for step in range(1, 6):
        reporter.saw(step, 0.5)
    assert time.monotonic() - started < 0.05
    hang.set()
    reporter.close(timeout=2)
    assert coordinator.sent == []
