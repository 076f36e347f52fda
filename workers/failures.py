"""What a turn's failure means: the infrastructure's fault (try the same attempt again,
later) or the attempt's (the job's failure policy decides).

Classified as Substra classifies task errors. The database, the relay's connection and
the checkpoint storage going away are the platform's problems, not the hospital's: the
turn is given back and run again after a growing delay, from its last checkpoint, without
costing the job a retry. Everything else, a hospital's bad frame, its silence, a bug, an
out-of-memory error, ends the attempt and goes to the job's policy (retry, skip or fail).
So no exception re-runs a turn forever: the starts of one attempt are capped too
(:func:`max_runs`), past which it fails with a reason that says so.
"""

from __future__ import annotations

from enum import StrEnum

import redis
from django.conf import settings
from django.db import DatabaseError, InterfaceError

from medsplit.errors import ChannelError, ChannelTimeout, RelayAbuse
from medsplit.turns import RelayOverused
from medsplit.turns.stores import StoreError

#: Seconds before the first retry of an infrastructure failure; doubled each time.
FIRST_BACKOFF = 2.0
MAX_BACKOFF = 120.0


class FailureKind(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    ATTEMPT = "attempt"


def classify(error: BaseException) -> FailureKind:
    """Whose fault ``error`` is (see the module docstring)."""
    if isinstance(error, RelayAbuse | RelayOverused | ChannelTimeout):
        return FailureKind.ATTEMPT  # a hospital's doing, or its silence
    if isinstance(error, DatabaseError | InterfaceError | redis.ConnectionError):
        return FailureKind.INFRASTRUCTURE
    if isinstance(error, redis.TimeoutError):
        return FailureKind.INFRASTRUCTURE
    if isinstance(error, ChannelError):
        return FailureKind.INFRASTRUCTURE  # the relay's connection, not what was sent
    if isinstance(error, StoreError) and isinstance(error.__cause__, OSError):
        return FailureKind.INFRASTRUCTURE  # the storage, not a changed file
    if isinstance(error, OSError) and not isinstance(error, ChannelError):
        return FailureKind.INFRASTRUCTURE
    return FailureKind.ATTEMPT


def backoff(runs: int) -> float:
    """Seconds to wait before start number ``runs + 1`` after an infrastructure failure."""
    return min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** max(0, runs - 1))


def max_runs(max_retries: int) -> int:
    """How many times one attempt of a turn may be started (a worker taking it over, an
    infrastructure retry): ``MEDSPLIT["TURN_MAX_RUNS"]``, else the job's retries plus two."""
    configured = settings.MEDSPLIT.get("TURN_MAX_RUNS")
    return int(configured) if configured else max_retries + 2
