"""Who may hold a thread waiting: the agents' long-polls for their assignments.

A long-poll holds one of gunicorn's threads for up to 30 s. Two limits keep them from
taking every thread, so that people's requests (and agents' other calls) always find one:

- **one waiting long-poll per agent token**, across every process (a slot in the shared
  cache): a second one at the same time is refused with 429, since an agent has one
  polling loop and twenty polls at once can only be an attack or a bug;
- **at most ``LONG_POLLS_PER_PROCESS`` waiting in each process**: beyond it, a poll is
  answered at once with what the agent would get at the end of its wait if nothing
  changed ("no change", the ETag it sent), and the agent polls again a little later.

A waiting poll builds its answer again when its hospital's change counter moves
(:mod:`training.assignment_changes`: what bumps it, and the one thread per process that
watches the counters of the waiting polls).

A waiting poll still builds its answer again every :func:`rebuild_seconds` without a bump:
every :data:`REBUILD_SECONDS` where the cache is this process's own (the embedded mode,
where the worker's bumps never reach the coordinator), every
:data:`SHARED_REBUILD_SECONDS` where it is shared (everything a hospital must act on
bumps its counter then; the rebuild bounds how late the rest of its answer, such as
another hospital's completed turn, is seen). Ten polls rebuilding twice a second took
most of a core of the coordinator.

Where the cache is shared, a poll that brings the ETag of the answer last built for its
hospital, at a counter that has not moved since, waits before it builds anything
(:class:`AnswersBuilt`): otherwise every wake cost two builds, the woken poll's and the
same answer again at the start of the agent's next poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache

from kernel.errors import TooManyRequests
from training.assignment_changes import WATCH

#: Extra seconds a token's slot outlives the longest wait: a request killed mid-wait
#: frees its slot then, at the latest.
_SLOT_SLACK_SECONDS = 30

#: How often a waiting poll builds its answer again without any bump, where the cache is
#: this process's own: the worker's changes are seen this way only.
REBUILD_SECONDS = 0.5
#: The same where the cache is shared by every process, so that every change bumps.
SHARED_REBUILD_SECONDS = 5.0


class LongPollBusy(TooManyRequests):
    """This agent token already has a long-poll waiting."""


class _WaitingRoom:
    """The long-polls waiting in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = 0

    def enter(self, limit: int) -> bool:
        with self._lock:
            if self._waiting >= limit:
                return False
            self._waiting += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._waiting -= 1


WAITING_ROOM = _WaitingRoom()


@contextmanager
def long_poll(*, token_id: object, wait: float) -> Iterator[float]:
    """Hold the slots of a long-poll of up to ``wait`` seconds by the agent token
    ``token_id``; yields the seconds it may actually wait (0: answer at once).

    Raises:
        LongPollBusy: the token has another long-poll waiting (429).
    """
    if wait <= 0:
        yield 0.0
        return
    slot = f"long-poll:token:{token_id}"
    if not cache.add(slot, 1, timeout=int(wait) + _SLOT_SLACK_SECONDS):
        raise LongPollBusy(
            "this agent token already has a long-poll waiting: poll again once it has "
            "been answered (one agent polls in one loop)",
            retry_after=max(1, int(wait)),
        )
    try:
        if not WAITING_ROOM.enter(settings.MEDSPLIT["LONG_POLLS_PER_PROCESS"]):
            yield 0.0  # every waiting thread of this process is taken: "no change"
            return
        try:
            yield wait
        finally:
            WAITING_ROOM.leave()
    finally:
        cache.delete(slot)


def rebuild_seconds() -> float:
    """How long a waiting poll goes without building its answer again when nothing bumped
    its counter: short where the cache is this process's own, so that the worker's
    changes (which bump another process's cache) are still seen soon."""
    return SHARED_REBUILD_SECONDS if every_change_bumps() else REBUILD_SECONDS


def every_change_bumps() -> bool:
    """Whether every change a hospital must act on bumps a counter this process reads:
    the cache is shared (a process-local one never sees the worker's bumps)."""
    return not isinstance(caches["default"], LocMemCache)


class AnswersBuilt:
    """The last answer this process built for each hospital: the change counter read
    before it was built, and its ETag.

    Where the cache is shared, an agent that polls again with that ETag while the counter
    has not moved holds the answer as it stands for what it must act on: its poll waits
    at once (the rebuild interval still bounds the rest), instead of building the same
    answer again first (each wake cost two builds: the woken poll's, and
    the next poll's before it waited). A record is trusted for :data:`TRUSTED_SECONDS`
    only: the counter itself expires an hour after its last bump and then reads 0 again.
    """

    TRUSTED_SECONDS = 600.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[int, tuple[int, str, float]] = {}

    def record(self, hospital_id: int, version: int, etag: str) -> None:
        with self._lock:
            self._built[hospital_id] = (version, etag, time.monotonic())

    def holds(self, hospital_id: int, version: int, etag: str) -> bool:
        """Whether ``etag`` is the answer last built for ``hospital_id`` at ``version``."""
        with self._lock:
            built = self._built.get(hospital_id)
        if built is None or not every_change_bumps():
            return False
        at_version, built_etag, at = built
        fresh = time.monotonic() - at < self.TRUSTED_SECONDS
        return fresh and (at_version, built_etag) == (version, etag)


ANSWERS_BUILT = AnswersBuilt()


def wait_for_change(hospital_id: int, seen: int, *, until: float) -> int:
    """Wait until hospital ``hospital_id``'s change counter differs from ``seen``,
    :func:`rebuild_seconds` have passed, or the monotonic time ``until``; the counter's
    value then."""
    return WATCH.wait(hospital_id, seen, until=min(until, time.monotonic() + rebuild_seconds()))
