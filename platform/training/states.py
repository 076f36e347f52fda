"""The life of a job: its states and the one table of transitions between them.

:func:`training.services.job_transition` is the only code that changes a job's state,
and it allows exactly the pairs in :data:`TRANSITIONS`. Each pair says who may ask for it:
a consortium admin (through the API) or only the system (the scheduler).

::

    draft ──schedule──▶ scheduled ──(system) start──▶ running ──(system)──▶ completed
      │                    │                          │   ▲
      │                    │                     pause│   │resume
      │                    │                          ▼   │
      │                    │                          paused
      └───────cancel───────┴────────cancel────────────┴───┴──▶ cancelled
                          running / paused ──(system, a turn failed)──▶ failed
"""

from __future__ import annotations

from enum import StrEnum

from django.db import models


class JobState(models.TextChoices):
    DRAFT = "draft"  # created and validated, not yet handed to the scheduler
    SCHEDULED = "scheduled"  # waiting for the scheduler to start it
    RUNNING = "running"  # turns are being taken
    PAUSED = "paused"  # no new turn starts; a turn in flight may still finish
    COMPLETED = "completed"  # every round done
    FAILED = "failed"  # a turn failed and the job's policy (or its retries) gave up
    CANCELLED = "cancelled"  # stopped by an admin


class Who(StrEnum):
    """Who may ask for a transition. The system may ask for every one."""

    ADMIN = "admin"  # a consortium admin (or the system)
    SYSTEM = "system"  # the scheduler only


#: Every allowed (from, to) pair and who may ask for it; any other pair is refused.
TRANSITIONS: dict[tuple[JobState, JobState], Who] = {
    (JobState.DRAFT, JobState.SCHEDULED): Who.ADMIN,
    (JobState.DRAFT, JobState.CANCELLED): Who.ADMIN,
    (JobState.SCHEDULED, JobState.RUNNING): Who.SYSTEM,
    (JobState.SCHEDULED, JobState.CANCELLED): Who.ADMIN,
    (JobState.RUNNING, JobState.PAUSED): Who.ADMIN,
    (JobState.RUNNING, JobState.CANCELLED): Who.ADMIN,
    (JobState.RUNNING, JobState.COMPLETED): Who.SYSTEM,
    (JobState.RUNNING, JobState.FAILED): Who.SYSTEM,
    (JobState.PAUSED, JobState.RUNNING): Who.ADMIN,
    (JobState.PAUSED, JobState.CANCELLED): Who.ADMIN,
    (JobState.PAUSED, JobState.FAILED): Who.SYSTEM,
}

#: States a job never leaves.
TERMINAL: frozenset[JobState] = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

#: States in which an agent holds an assignment for the job.
ASSIGNED: frozenset[JobState] = frozenset({JobState.SCHEDULED, JobState.RUNNING})


def allowed(current: str, requested: str) -> Who | None:
    """Who may move a job from ``current`` to ``requested``; ``None`` if nobody may."""
    try:
        return TRANSITIONS.get((JobState(current), JobState(requested)))
    except ValueError:  # not a state at all
        return None
