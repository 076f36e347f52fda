"""What wakes an agent's long-poll: a change counter per hospital in the shared cache,
bumped when what the hospital is assigned may have changed, and one watcher per process
that reads the counters of the hospitals whose polls wait there.

Every save or delete of a job, its participants, rounds, aggregations or evaluations
bumps the counter of every participant of the job; a turn's, its own hospital's (its
progress nobody's); a hand-off, its recipient's while the recipient waits for it; a
re-enrolled hospital's new identity key, the participants of its jobs'. Each bumps after
the transaction commits, since a poll woken before would build the same answer again
and wait on (:func:`assignments_changed` and :func:`hospital_changed`, connected in
``training/apps.py``). The services' ``QuerySet.update`` calls, which send no signal,
change nothing an agent acts on without a save beside them that does (a job's
transition saves the job, a new round creates a ``Round``, an evaluation ends with its
parts' saves).

So a poll is woken by what its hospital must act on, not by everything its answer shows:
another hospital's completed turn changes where the next turn starts from in every
answer, but only the next hospital acts on it, and its own turn's start wakes it. The
others see it at their poll's next rebuild (``training.api.long_poll``: at most
``SHARED_REBUILD_SECONDS`` later), several turns in one build. Waking every participant
at every turn's start and end had the coordinator build n answers at once, and the next
hospital's answer waited behind them.

The watcher (:class:`ChangeWatch`, one thread per process) reads the counters of every
hospital with a poll waiting in one cache read every :data:`WAKE_CHECK_SECONDS` (or at
once after a bump in this process) and wakes the polls whose counter moved: ten waiting
polls cost one read, where each used to read its own fifty times a second.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable

from django.core.cache import cache
from django.db import transaction

logger = logging.getLogger(__name__)

#: How often the watcher reads the waiting polls' change counters (one cache read for all
#: of them): a change bumped in another process (the worker's) reaches the next
#: hospital's poll this late at most.
WAKE_CHECK_SECONDS = 0.02
_VERSION_KEY = "assignments:version"
#: The counter lives an hour after its last bump; a missing one reads as 0 (a change).
_VERSION_TTL_SECONDS = 3600


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
    WATCH.poke()


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
    wake the long-polls of the participants who act on it, once the current transaction
    commits. Woken before the commit, a poll would build the same answer
    again and wait on."""
    from training.models import HandOff, Job, Turn

    if sender is Turn and update_fields and PROGRESS_FIELDS.issuperset(update_fields):
        return
    if isinstance(instance, HandOff):
        handoff = instance
        transaction.on_commit(lambda: _wake_recipient(handoff))
        return
    if isinstance(instance, Turn):
        # A turn changes what its own hospital does. Once completed it shows in the
        # others' answers too (where the next turn starts from), but none of them acts on
        # it: the next hospital is woken by its own turn's start, everyone by the round's
        # or the job's end. Waking all n at every turn's start and end made the
        # coordinator build n answers at once, and the next hospital's waited behind them.
        hospital = instance.hospital_id
        transaction.on_commit(lambda: wake_long_polls([hospital]))
        return
    job_id = instance.pk if isinstance(instance, Job) else getattr(instance, "job_id", None)
    if job_id is not None:
        transaction.on_commit(lambda: wake_job(job_id))


def _wake_recipient(handoff: object) -> None:
    """A hand-off shows only in its recipient's answer (``handoffs_to_me``), and matters
    to it only while it waits for it: in its own running turn, or for the final weights
    of a job that ended. Its other polls would build a new answer n - 1 times a turn for
    nothing; the start of its next turn shows the hand-off anyway."""
    from training.models import Job, Turn
    from training.states import TERMINAL

    job_id, recipient = handoff.job_id, handoff.recipient_id  # type: ignore[attr-defined]
    waiting = (
        Turn.objects.filter(
            job_id=job_id, hospital_id=recipient, status=Turn.Status.RUNNING
        ).exists()
        or Job.objects.filter(pk=job_id, state__in=list(TERMINAL)).exists()
    )
    if waiting:
        wake_long_polls([recipient])


def hospital_changed(
    sender: type, instance: object, update_fields: Iterable[str] | None = None, **_: object
) -> None:
    """A signal receiver for a saved hospital: a new identity key (re-enrolment) shows in
    the answers of every participant of its jobs; any other save (status, approval)
    shows in none and wakes nobody."""
    from training.models import JobParticipant

    if update_fields is not None and "identity_key" not in update_fields:
        return
    hospital_id = instance.pk  # type: ignore[attr-defined]

    def wake() -> None:
        jobs = JobParticipant.objects.filter(hospital_id=hospital_id).values("job_id")
        wake_long_polls(
            JobParticipant.objects.filter(job_id__in=jobs).values_list("hospital_id", flat=True)
        )

    transaction.on_commit(wake)


class ChangeWatch:
    """The change counters of the hospitals whose polls wait in this process, read by one
    thread for all of them.

    The thread runs while a poll waits and sleeps otherwise; it reads every waiting
    hospital's counter in one ``get_many`` every :data:`WAKE_CHECK_SECONDS`, or at once
    when this process bumped one (:meth:`poke`), and wakes the polls whose counter moved.
    A cache that fails is logged and read again: the polls then fall back to their
    rebuild interval, as if nothing bumped.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._poked = threading.Event()
        self._waiting: Counter[int] = Counter()
        self._versions: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0

    def poke(self) -> None:
        """Read the counters now (a bump was just made in this process)."""
        self._poked.set()

    def wait(self, hospital_id: int, seen: int, *, until: float) -> int:
        """Block until hospital ``hospital_id``'s counter differs from ``seen``, or the
        monotonic time ``until``; the counter's value then (``seen`` when it did not move)."""
        with self._changed:
            self._waiting[hospital_id] += 1
            self._ensure_thread()
            try:
                self._changed.wait_for(
                    lambda: self._versions.get(hospital_id, seen) != seen,
                    timeout=max(0.0, until - time.monotonic()),
                )
                return self._versions.get(hospital_id, seen)
            finally:
                self._waiting[hospital_id] -= 1
                if not self._waiting[hospital_id]:
                    # Gone stale once nobody waits: the next poll starts from its own read.
                    del self._waiting[hospital_id]
                    self._versions.pop(hospital_id, None)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            self._changed.notify_all()
            return
        # First poll in this process (or in a child forked from one that had the thread).
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="long-poll-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._waiting))
                ids = list(self._waiting)
            try:
                found = cache.get_many([_version_key(h) for h in ids])
            except Exception:  # the watcher must outlive a cache that fails
                logger.warning("reading the long-polls' change counters failed", exc_info=True)
                found = None
            if found is not None:
                with self._changed:
                    moved = False
                    for h in ids:
                        if h not in self._waiting:
                            continue
                        value = int(found.get(_version_key(h), 0))
                        moved |= self._versions.get(h) != value
                        self._versions[h] = value
                    if moved:
                        self._changed.notify_all()
            self._poked.wait(WAKE_CHECK_SECONDS)
            self._poked.clear()


WATCH = ChangeWatch()
