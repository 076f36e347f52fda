"""What the agent does when its hijacking check trips (``privacy.hijack_detection``).

The turn's :class:`~medsplit.turns.TurnClient` refused the server's gradient frame and
raised :class:`~medsplit.defenses.hijack.HijackDetected`. The agent tells the
coordinator through the turn-problem path (the turn attempt fails with the reason, which
the coordinator's audit log records as ``turn.problem_reported``), and keeps a mark in the
job's folder: from then on it refuses every turn of that job, also after a restart,
reporting the same reason each time.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hospital_agent.coordinator import Coordinator, CoordinatorError, TokenRefused
from hospital_agent.identity import write_private
from medsplit.defenses.hijack import HijackDetected

logger = logging.getLogger(__name__)

MARK = "hijack-detected.json"


def detected_before(folder: Path) -> str | None:
    """The reason this hospital stopped taking part in the job, if it did."""
    path = folder / MARK
    if not path.exists():
        return None
    try:
        return str(json.loads(path.read_text())["reason"])
    except (ValueError, KeyError, TypeError):
        return "hijacking suspected earlier in this job (the mark does not read)"


def stop_taking_part(
    coordinator: Coordinator, *, job: int, turn_id: int, folder: Path, error: HijackDetected
) -> None:
    """Keep the mark, then have the coordinator fail the turn with the reason."""
    folder.mkdir(parents=True, exist_ok=True)
    reason = str(error)
    write_private(folder / MARK, json.dumps({"reason": reason, "step": error.step}).encode())
    refuse(coordinator, job=job, turn_id=turn_id, reason=reason)


def refuse(coordinator: Coordinator, *, job: int, turn_id: int, reason: str) -> None:
    """Tell the coordinator this hospital takes no part in the turn, and why."""
    logger.error("job %s: %s", job, reason)
    try:
        coordinator.report_problem(job=job, turn=turn_id, reason=reason)
    except CoordinatorError as e:
        if isinstance(e, TokenRefused):
            raise
        logger.warning("job %s: the detection could not be reported: %s", job, e)
