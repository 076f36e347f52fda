"""The workers' check of what each hospital stores on the relay.

A hospital's Redis user may append to its own streams and leave blobs for the other
participants, and a Redis ACL cannot bound how much. What an honest hospital stores is
known from its jobs (:mod:`medsplit.training.relay_limits`): so the workers, who read its
streams, measure every key it wrote (``MEMORY USAGE``) against the bound of the job named in
the key, and suspend the user of a hospital that goes beyond (``hospitals.relay_services``).
The check runs every few seconds during a turn, for the hospital whose turn it is, and on
every sweep for every hospital with a relay user.

Reads only: ``SCAN`` with the hospital's patterns, then one pipelined ``MEMORY USAGE`` per
key. Both are allowed to the workers' own Redis user.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import redis

from medsplit.channel.keys import RelayKeys
from medsplit.training.relay_limits import KEY_OVERHEAD, RelayLimits

logger = logging.getLogger(__name__)

#: The job of a key: its hash tag.
_TAG = re.compile(r"\{([^{}]+)\}")
MiB = 1 << 20

#: The bounds of ``(job, hospital)``, or ``None`` when the hospital takes no part in it.
LimitsOf = Callable[[str, str], RelayLimits | None]


@dataclass(frozen=True)
class KeyUse:
    """One key a hospital wrote, what it holds and what its job allows."""

    key: str
    used: int
    allowed: int

    @property
    def over(self) -> bool:
        return self.used > self.allowed


@dataclass(frozen=True)
class Overuse:
    """A hospital stores more than its jobs allow."""

    hospital: str
    used: int
    keys: tuple[KeyUse, ...]

    def reason(self) -> str:
        """What the hospital stored and where, in words (sizes and key names only)."""
        worst = sorted((k for k in self.keys if k.over), key=lambda k: -k.used)
        shown = "; ".join(
            f"{k.key} holds {k.used / MiB:.2f} MiB (at most {k.allowed / MiB:.2f} MiB)"
            for k in worst[:3]
        )
        more = f" and {len(worst) - 3} more keys" if len(worst) > 3 else ""
        return (
            f"hospital {self.hospital} stored {self.used / MiB:.1f} MiB on the relay, beyond "
            f"what its jobs allow: {shown}{more}"
        )


class RelayGuard:
    """Measures one hospital's keys on the relay against its jobs' bounds.

    Args:
        client: a connection to the relay as the workers' user.
        keys: the deployment's key layout.
        limits_of: the bounds of a job for a hospital (``None``: it takes no part in it).
    """

    def __init__(self, client: redis.Redis, keys: RelayKeys, limits_of: LimitsOf) -> None:
        self.client = client
        self.keys = keys
        self.limits_of = limits_of

    def usage(self, hospital: str) -> list[KeyUse]:
        """Every key ``hospital`` wrote (its streams, counters and sent blobs)."""
        found = [
            key.decode() if isinstance(key, bytes) else key
            for pattern in (
                self.keys.hospital_streams_pattern(hospital),
                self.keys.outbox_pattern(hospital),
            )
            for key in self.client.scan_iter(match=pattern, count=1000)
        ]
        if not found:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in found:
            pipe.memory_usage(key, samples=0)
        sizes = pipe.execute()
        # A job's bounds once per check, not once per key: a hospital's keys are mostly
        # the blobs it sealed for the others, n - 1 per turn, kept for days, and each
        # look-up reads the database.
        limits: dict[str | None, RelayLimits | None] = {}
        return [
            KeyUse(key, int(size or 0), self._allowed(key, hospital, limits))
            for key, size in zip(found, sizes, strict=True)
        ]

    def check(self, hospital: str) -> Overuse | None:
        """An :class:`Overuse` if any key of ``hospital`` holds more than its job allows."""
        uses = self.usage(hospital)
        if not any(use.over for use in uses):
            return None
        return Overuse(hospital, sum(use.used for use in uses), tuple(uses))

    def _allowed(
        self, key: str, hospital: str, limits: dict[str | None, RelayLimits | None]
    ) -> int:
        """What ``key`` may hold: by its kind, under the bounds of the job in its tag
        (looked up in ``limits`` first, and kept there). A key of a job the hospital
        takes no part in may hold nothing beyond a key's own cost (an empty stream left
        over, say)."""
        tag = _TAG.search(key)
        job = tag.group(1) if tag else None
        if job not in limits:
            limits[job] = self.limits_of(job, hospital) if job is not None else None
        bounds = limits[job]
        if bounds is None:
            return KEY_OVERHEAD
        if key.endswith(":seq"):
            return bounds.counter_bytes
        if key.startswith(self.keys.hospital_prefix(hospital)):
            if key.endswith((":agg:up", ":agg:down")):  # masked vectors, not frames
                return bounds.aggregation_stream_bytes or KEY_OVERHEAD
            return bounds.stream_bytes
        return bounds.blob_bytes + KEY_OVERHEAD
