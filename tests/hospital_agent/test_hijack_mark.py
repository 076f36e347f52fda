"""The agent's reaction to a tripped hijacking check: the coordinator is told, and the
job's mark refuses every later turn with the same reason (a restart included)."""

from __future__ import annotations

import stat
from pathlib import Path

from hospital_agent.hijack import MARK, detected_before, refuse, stop_taking_part
from medsplit.defenses.hijack import HijackDetected


class Coordinator:
    def __init__(self) -> None:
        self.problems: list[tuple[int, int, str]] = []

    def report_problem(self, *, job: int, turn: int, reason: str) -> dict:
        self.problems.append((job, turn, reason))
        return {}


def test_a_detection_is_reported_and_marks_the_job_for_good(tmp_path: Path) -> None:
    coordinator = Coordinator()
    folder = tmp_path / "jobs" / "job-7"
    error = HijackDetected(step=2, outliers=3, window=3, score=6.0)
    assert detected_before(folder) is None
    stop_taking_part(coordinator, job=7, turn_id=40, folder=folder, error=error)  # type: ignore[arg-type]
    assert coordinator.problems == [(7, 40, str(error))]
    assert stat.S_IMODE((folder / MARK).stat().st_mode) == 0o600
    # A later turn of the job (or a restarted agent) reads the same reason back.
    reason = detected_before(folder)
    assert reason == str(error)
    refuse(coordinator, job=7, turn_id=41, reason=reason)  # type: ignore[arg-type]
    assert coordinator.problems[-1] == (7, 41, str(error))
