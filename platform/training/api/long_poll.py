"""Who may hold a thread waiting: the agents' long-polls for their assignments.

A long-poll holds one of gunicorn's threads for up to 30 s. Two limits keep them from
taking every thread, so that people's requests (and agents' other calls) always find one:

- **one waiting long-poll per agent token**, across every process (a slot in the shared
  cache): a second one at the same time is refused with 429, since an agent has one
  polling loop and twenty polls at once can only be an attack or a bug;
- **at most ``LONG_POLLS_PER_PROCESS`` waiting in each process**: beyond it, a poll is
  answered at once with what the agent would get at the end of its wait if nothing
  changed ("no change", the ETag it sent), and the agent polls again a little later.

A waiting poll is woken when what its hospital is assigned may have changed: every save
or delete of a job, its participants, rounds, turns, aggregations or evaluations bumps a
counter per participant of the job in the shared cache, a hand-off its recipient's only,
and a turn's progress nobody's (after the transaction commits; see
:func:`assignments_changed`, connected in ``training/apps.py``; other hospitals' polls are
not woken, so ten idle agents do not rebuild their answers at every step of someone else's
job), which a waiting poll
reads every :data:`WAKE_CHECK_SECONDS` (a cache read) and only then builds its answer
again. Without a bump (a change made with ``QuerySet.update``, or the worker on another
process with a per-process cache) the answer is still built again every
:data:`REBUILD_SECONDS`, as before the counter existed: the counter only shortens waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from kernel.errors import TooManyRequests

#: Extra seconds a token's slot outlives the longest wait: a request killed mid-wait
#: frees its slot then, at the latest.
_SLOT_SLACK_SECONDS = 30

#: How often a waiting poll reads the change counter (one cache read): the hand-over to
#: the next hospital waits for its long-poll's answer, so for at most this long.
WAKE_CHECK_SECONDS = 0.02
#: How often a waiting poll builds its answer again without any bump of the counter.
REBUILD_SECONDS = 0.5
_VERSION_KEY = "assignments:version"
#: The counter lives an hour after its last bump; a missing one reads as 0 (a change).
_VERSION_TTL_SECONDS = 3600


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


def _version_key(hospital_id: int) -> str:
    return f"{_VERSION_KEY}:{hospital_id}"


def assignments_version(hospital_id: int) -> int:
    """Hospital ``hospital_id``'s change counter now (0 where it is not set)."""
    return int(cache.get(_version_key(hospital_id), 0))


def wake_long_polls(hospital_ids: Iterable[int]) -> None:
    """Bump these hospitals' change counters now: their waiting long-polls build their
    answers again (those of other hospitals wait on, undisturbed)."""
    for hospital_id in set(hospital_ids):
        key = _version_key(hospital_id)
        if cache.add(key, 1, timeout=_VERSION_TTL_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=_VERSION_TTL_SECONDS)
        cache.touch(key, _VERSION_TTL_SECONDS)


def wake_job(job_id: int) -> None:
    """Wake the waiting long-polls of job ``job_id``'s participants."""
    from training.models import JobParticipant

    wake_long_polls(
        JobParticipant.objects.filter(job_id=job_id).values_list("hospital_id", flat=True)
    )


#: A turn's fields that no assignment shows (``AssignmentTurnSerializer``): its progress
#: and last loss, saved about every second of a running turn. Saving only these wakes
#: nobody; when every save woke every participant's poll, ten idle agents rebuilt their
#: answers several times a second, which slowed the coordinator and the steps.
PROGRESS_FIELDS = frozenset({"steps", "samples", "bytes_up", "bytes_down", "last_loss"})


def assignments_changed(
    sender: type, instance: object, update_fields: Iterable[str] | None = None, **_: object
) -> None:
    """A signal receiver for a saved or deleted job, or a row of one (with ``job_id``):
    wake its participants' long-polls once the current transaction commits. Woken
    before the commit, a poll would build the same answer again and wait on."""
    from training.models import HandOff, Job, Turn

    if sender is Turn and update_fields and PROGRESS_FIELDS.issuperset(update_fields):
        return
    if isinstance(instance, HandOff):
        # Only its recipient's answer shows it (``handoffs_to_me``): after each turn the
        # sender records one per other participant, which would wake every poll n - 1 times.
        recipient = instance.recipient_id
        transaction.on_commit(lambda: wake_long_polls([recipient]))
        return
    job_id = instance.pk if isinstance(instance, Job) else getattr(instance, "job_id", None)
    if job_id is not None:
        transaction.on_commit(lambda: wake_job(job_id))


def wait_for_change(hospital_id: int, seen: int, *, until: float) -> int:
    """Wait until hospital ``hospital_id``'s change counter differs from ``seen``,
    :data:`REBUILD_SECONDS` have passed, or the monotonic time ``until``; the counter's
    value then."""
    stop = min(until, time.monotonic() + REBUILD_SECONDS)
    while True:
        now = assignments_version(hospital_id)
        if now != seen or time.monotonic() >= stop:
            return now
        time.sleep(max(0.0, min(WAKE_CHECK_SECONDS, stop - time.monotonic())))
