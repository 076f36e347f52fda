"""The sealed hand-offs an agent left on the relay, kept so that a relay which lost them
gets them back.

The relay keeps no data across a restart (docs/deploy.md): a blob left there for the next
hospital and not fetched yet is gone with it, and the job would stop there, since nobody
else holds those bytes and the coordinator recorded their hash. So the agent keeps the
exact bytes of the latest blob it left in each slot of each job (a slot is a relay key:
a recipient and a topic, so both hand-off slots of a parallel plan, ``handoff`` and
``handoff-odd``, are kept), and counts each
blob it leaves in a mark next to them on the relay: the field ``left`` of its own ``train``
up stream's counters (``<prefix>:hospital:<slug>:{job-N}:train:up:seq``), raised in the
same ``MULTI``/``EXEC`` as the blob is written, so the relay keeps both or neither. A mark
that is not the agent's own count means the relay lost data since (a restart, or the
workers resetting that stream): the agent puts every kept blob back with ``SET NX`` (one
still there is left alone), the same bytes, so the recorded hash still holds.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import redis

from medsplit.channel.redis import SEQ_SUFFIX

#: The field of the counters hash that counts the blobs left.
MARK = "left"


@dataclass(frozen=True)
class Left:
    """One sealed blob left for a recipient: its key, its bytes, where its mark is."""

    key: str
    blob: bytes
    counter: str
    at: float = field(default_factory=time.monotonic)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.blob).hexdigest()


def counter_of(up_stream: str) -> str:
    """The counters hash of a hospital's up stream, where its mark lives."""
    return up_stream + SEQ_SUFFIX


def leave(client: redis.Redis, left: Left, *, ttl: int, only_if_missing: bool = False) -> None:
    """Write ``left``'s blob (``SET ... EX``, with ``NX`` when ``only_if_missing``) and
    raise its mark, in one transaction."""
    with client.pipeline(transaction=True) as pipe:
        pipe.set(left.key, left.blob, ex=ttl, nx=only_if_missing)
        pipe.hincrby(left.counter, MARK, 1)
        pipe.execute()


@dataclass
class Outbox:
    """What one agent left on the relay, per job: the latest blob per slot (its relay key)
    and how many blobs it counted into the job's mark."""

    ttl: int
    _left: dict[str, dict[str, Left]] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    def left(self, job: str, left: Left) -> None:
        """``left`` was written, with its mark; it replaces what this slot held before."""
        self._left.setdefault(job, {})[left.key] = left
        self._count[job] = self._count.get(job, 0) + 1

    def holds(self, job: str) -> bool:
        return bool(self._left.get(job))

    def restore(self, client: redis.Redis, job: str) -> int:
        """Put back what the relay lost of ``job``'s blobs; how many were written again.

        Raises:
            redis.RedisError: the relay did not answer.
        """
        kept = [left for left in self._left.get(job, {}).values() if self._fresh(left)]
        if not kept:
            self.forget(job)
            return 0
        counter = kept[0].counter
        if int(client.hget(counter, MARK) or 0) == self._count.get(job, 0):
            return 0
        # Counted afresh from here: a restart in the middle shows as a wrong count again.
        client.hset(counter, MARK, 0)
        self._count[job] = 0
        for left in kept:
            leave(client, left, ttl=self.ttl, only_if_missing=True)
            self._count[job] += 1
        return len(kept)

    def forget(self, job: str) -> None:
        self._left.pop(job, None)
        self._count.pop(job, None)

    def _fresh(self, left: Left) -> bool:
        """Whether the relay would still hold it: blobs expire after ``ttl``."""
        return time.monotonic() - left.at < self.ttl
