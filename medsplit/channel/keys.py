"""The relay's key layout: every key MedSplit puts in Redis, for every feature, in one place.

One deployment's keys all start with its prefix (a setting, ``medsplit`` by default), so two
deployments or test runs sharing one Redis never collide. A job is always spelt the way its
frames spell it (``job-7``), and always inside braces: on a Redis Cluster that is the key's
hash tag, so every key of one job lives on one node. Slugs are lower-case letters, digits and
inner hyphens (no ``:``, no glob character, no brace), prefixes too.

Two families of keys, each anchored so that a hospital's access rules can name its own
keys exactly::

    <prefix>:hospital:<slug>:{<job>}:<topic>:up        stream, hospital -> worker
    <prefix>:hospital:<slug>:{<job>}:<topic>:up:seq    its counters (RedisChannel)
    <prefix>:hospital:<slug>:{<job>}:<topic>:down      stream, worker -> hospital
    <prefix>:hospital:<slug>:{<job>}:<topic>:down:seq
    <prefix>:mail:to:<recipient>:from:<sender>:{<job>}:<topic>
                                                        a sealed blob from one hospital
                                                        to another (SET by the sender,
                                                        GET by the recipient)

The workers keep a third family for themselves (no hospital reaches it)::

    <prefix>:worker:queue:<queue>:<worker>             "this worker consumes this queue",
                                                        with a time to live
    <prefix>:celery:<kombu's own key>                  Celery's queues, bindings and
                                                        unacked sets (kombu's
                                                        ``global_keyprefix``)

``<topic>`` names what a stream pair or a blob is for (:data:`STREAM_TOPICS`,
:data:`MAIL_TOPICS`): training turns, secure-aggregation submissions and inference
requests between a hospital and the workers; hand-offs, private-set-intersection
messages (``psi``: a request one way, its reply the other), the intersection handed on
(``alignment``; ``psi-test`` and ``alignment-test`` for the test records a vertical
job's evaluation aligns, ``psi-predict`` and ``alignment-predict`` for the records of a
vertical prediction), a vertical job's label-leakage scores (``leakage``), mask seeds and model
exports between hospitals.

Why the patterns cannot reach another hospital's keys:

- ``<prefix>:hospital:<slug>:*`` is anchored at the start, and a slug holds no ``:``, so
  only keys of that very slug begin that way.
- A recipient reads ``<prefix>:mail:to:<slug>:from:*``: anchored the same way.
- A sender writes ``<prefix>:mail:to:*:from:<slug>:{*``: a mail key holds exactly one
  ``{``, right after its sender, so ``:from:<slug>:{`` can match only where the sender is
  ``<slug>``, whatever the other slugs are.

Every word of the layout is also refused as a slug (:data:`RESERVED_WORDS`), so that no
name in a message or a log can be mistaken for another part of a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from medsplit.errors import ConfigError

DEFAULT_PREFIX = "medsplit"
#: What a prefix or a slug may be: lower-case letters, digits and inner hyphens.
NAME_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?"
_NAME = re.compile(NAME_PATTERN)
_PREFIX = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
#: Job ids as frames carry them (``medsplit.training.config``), without braces.
_JOB = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

HOSPITAL = "hospital"
MAIL = "mail"
WORKER = "worker"
UP = "up"
DOWN = "down"
SEQ = "seq"

#: Stream pairs between a hospital and the workers, by what they carry.
STREAM_TOPICS = ("train", "agg", "infer")
#: Blobs from one hospital to another, by what they carry.
MAIL_TOPICS = (
    "handoff",
    "handoff-odd",
    "psi",
    "alignment",
    "psi-test",
    "alignment-test",
    "psi-predict",
    "alignment-predict",
    "leakage",
    "mask-seed",
    "export",
)

#: Every fixed word of the layout; none may be a hospital's slug.
RESERVED_WORDS = frozenset(
    {HOSPITAL, MAIL, "to", "from", UP, DOWN, SEQ, *STREAM_TOPICS, *MAIL_TOPICS}
    | {"worker", "workers", "celery", "default", "admin", "job"}
)


@dataclass(frozen=True)
class StreamPair:
    """The two streams between one hospital and the workers: agent to worker (``up``)
    and back (``down``), as :meth:`RelayKeys.streams` names them."""

    up: str
    down: str


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid slug-like name, else a :class:`ConfigError` naming ``what``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigError(
            f"{what} must be lower-case letters, digits and inner hyphens (at most 64), "
            f"got {value!r}"
        )
    return value


@dataclass(frozen=True)
class RelayKeys:
    """The key layout of one deployment (see the module docstring).

    Attributes:
        prefix: the deployment's prefix, at most 32 characters of ``[a-z0-9-]``.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX.fullmatch(self.prefix):
            raise ConfigError(
                "the relay prefix must be 1-32 lower-case letters, digits and inner hyphens, "
                f"got {self.prefix!r}"
            )

    # -- keys -------------------------------------------------------------------------

    def streams(self, job: str, hospital: str, topic: str = "train") -> StreamPair:
        """The stream pair of ``hospital`` in ``job`` for ``topic``: up to the workers and
        down from them. Each stream's counters sit at ``<stream>:seq``."""
        base = f"{self.hospital_prefix(hospital)}{{{_job(job)}}}:{_topic(topic, STREAM_TOPICS)}"
        return StreamPair(up=f"{base}:{UP}", down=f"{base}:{DOWN}")

    def mail(self, job: str, *, sender: str, recipient: str, topic: str = "handoff") -> str:
        """The key of the blob ``sender`` puts for ``recipient`` in ``job`` about ``topic``."""
        check_name(sender, "a sender's slug")
        return (
            f"{self.inbox_prefix(recipient)}{sender}:{{{_job(job)}}}:{_topic(topic, MAIL_TOPICS)}"
        )

    def hospital_prefix(self, hospital: str) -> str:
        """What every stream key of ``hospital`` starts with."""
        return f"{self.prefix}:{HOSPITAL}:{check_name(hospital, 'a hospital slug')}:"

    def inbox_prefix(self, recipient: str) -> str:
        """What every mail key addressed to ``recipient`` starts with."""
        return f"{self.prefix}:{MAIL}:to:{check_name(recipient, 'a recipient slug')}:from:"

    # -- patterns (Redis glob) -------------------------------------------------------------

    def hospital_streams_pattern(self, hospital: str) -> str:
        """Every stream and counter of ``hospital`` (it reads and writes them)."""
        return self.hospital_prefix(hospital) + "*"

    def inbox_pattern(self, recipient: str) -> str:
        """Every blob addressed to ``recipient`` (it reads them)."""
        return self.inbox_prefix(recipient) + "*"

    def outbox_pattern(self, sender: str) -> str:
        """Every blob ``sender`` sends (it writes and deletes them)."""
        return f"{self.prefix}:{MAIL}:to:*:from:{check_name(sender, 'a sender slug')}:{{*"

    def patterns_of(self, hospital: str) -> tuple[str, str, str]:
        """Every key that concerns ``hospital``: its streams, its inbox and its outbox."""
        return (
            self.hospital_streams_pattern(hospital),
            self.inbox_pattern(hospital),
            self.outbox_pattern(hospital),
        )

    def worker_queue(self, queue: str, worker: str) -> str:
        """The heartbeat key of ``worker`` consuming ``queue`` (names made key-safe)."""
        return f"{self.prefix}:{WORKER}:queue:{_safe(queue)}:{_safe(worker)}"

    def worker_queues_pattern(self) -> str:
        """Every worker's queue heartbeat."""
        return f"{self.prefix}:{WORKER}:queue:*"

    def queue_of(self, heartbeat_key: str) -> str | None:
        """The queue a heartbeat key names, or ``None`` for another key."""
        head = f"{self.prefix}:{WORKER}:queue:"
        if not heartbeat_key.startswith(head):
            return None
        queue, sep, _ = heartbeat_key[len(head) :].partition(":")
        return queue if sep else None

    def celery_prefix(self) -> str:
        """What kombu puts before every key Celery makes (its ``global_keyprefix``)."""
        return f"{self.prefix}:celery:"

    def deployment_pattern(self) -> str:
        """Every key of this deployment (the workers reach all of them)."""
        return f"{self.prefix}:*"

    # -- reading keys back -----------------------------------------------------------------

    def owner(self, key: str) -> str | None:
        """The hospital that wrote ``key`` (a stream key's hospital, a mail key's sender),
        or ``None`` for a key that is not a hospital's under this layout."""
        parts = key.split(":")
        if len(parts) < 4 or parts[0] != self.prefix:
            return None
        if parts[1] == HOSPITAL and _NAME.fullmatch(parts[2]):
            return parts[2]
        if parts[1] == MAIL and len(parts) >= 7 and parts[2] == "to" and parts[4] == "from":
            return parts[5] if _NAME.fullmatch(parts[5]) else None
        return None


def _safe(name: str) -> str:
    """A queue or worker name as a key part: no ``:`` and no glob characters."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name)[:200]


def _job(job: str) -> str:
    if not isinstance(job, str) or not _JOB.fullmatch(job):
        raise ConfigError(f"job id must be 1-128 characters of [A-Za-z0-9_.:-], got {job!r}")
    return job


def _topic(topic: str, known: tuple[str, ...]) -> str:
    if topic not in known:
        raise ConfigError(f"unknown relay topic {topic!r}; known: {', '.join(known)}")
    return topic
