"""What ``GET /metrics`` reports about the consortium, read when Prometheus scrapes.

Nothing is counted in process memory: gunicorn runs several processes, and counters kept
in one of them would disagree with the others and vanish on restart. The database is the
source of truth, so each scrape asks it, in four aggregate queries, and asks the Celery
broker for the length of its queues, in one pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import Count, Max, Min, Q, Sum
from django.utils import timezone
from kombu.transport.redis import PRIORITY_STEPS
from kombu.transport.redis import Channel as KombuRedisChannel
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from hospitals.models import Hospital
from hospitals.relay_acl import relay_keys
from hospitals.selectors import hospital_list
from kernel.actors import Actor
from medsplit.channel.connect import connect
from training.models import Job, MetricPoint, Turn
from training.states import JobState

logger = logging.getLogger(__name__)

#: The window of ``medsplit_steps_per_second``.
STEPS_RATE_WINDOW_SECONDS = 60
#: A scrape must not hang on a broker that is away.
BROKER_TIMEOUT_SECONDS = 1.0

#: Hospital presence, as the dashboard shows it: enrolled and heard from within
#: ``MEDSPLIT_OFFLINE_AFTER`` (online) or not (offline); any other status: not enrolled.
PRESENCES = ("online", "offline", "not_enrolled")


class ConsortiumCollector(Collector):
    """Jobs, turns, steps, bytes at the cut, hospitals and the Celery queues, as of now.

    Args:
        broker_url: the Celery broker (a Redis URL, as ``CELERY_BROKER_URL``).
        queues: the Celery queues whose lengths are reported.
        now: the time to count from (tests); the scrape's time by default.
    """

    def __init__(
        self, *, broker_url: str, queues: Sequence[str], now: datetime | None = None
    ) -> None:
        self.broker_url = broker_url
        self.queues = list(queues)
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        yield self._jobs()
        yield from self._turns()
        yield self._steps_per_second(now)
        yield from self._hospitals(now)
        yield from self._broker()

    def _jobs(self) -> Metric:
        counts = dict(
            Job.objects.order_by().values("state").annotate(n=Count("pk")).values_list("state", "n")
        )
        jobs = GaugeMetricFamily("medsplit_jobs", "Jobs in each state.", labels=["state"])
        for state in JobState.values:  # every state, 0 included: absent series break alerts
            jobs.add_metric([state], counts.get(state, 0))
        return jobs

    def _turns(self) -> Iterator[Metric]:
        rows = {
            row["status"]: row
            for row in Turn.objects.order_by()
            .values("status")
            .annotate(
                n=Count("pk"),
                steps=Sum("steps"),
                samples=Sum("samples"),
                up=Sum("bytes_up"),
                down=Sum("bytes_down"),
            )
        }
        turns = GaugeMetricFamily(
            "medsplit_turns", "Turns (each attempt a turn) in each status.", labels=["status"]
        )
        for status in Turn.Status.values:
            turns.add_metric([status], rows.get(status, {}).get("n", 0))
        yield turns

        def total(field: str) -> int:
            return sum(row[field] or 0 for row in rows.values())

        # Sums over every turn row: they only grow while the rows are kept (a turn's
        # counters never go down; a retry is a new row), which is what a counter needs.
        yield CounterMetricFamily(
            "medsplit_turn_steps",
            "Training steps recorded by all turns (a retried step counts once per attempt).",
            value=total("steps"),
        )
        yield CounterMetricFamily(
            "medsplit_turn_samples",
            "Training samples recorded by all turns.",
            value=total("samples"),
        )
        crossed = CounterMetricFamily(
            "medsplit_cut_bytes",
            "Bytes that crossed the cut as recorded by all turns: up = hospital to worker.",
            labels=["direction"],
        )
        crossed.add_metric(["up"], total("up"))
        crossed.add_metric(["down"], total("down"))
        yield crossed

    def _steps_per_second(self, now: datetime) -> Metric:
        # Progress points are kept about once a second per running turn; the steps a turn
        # gained between its first and last point in the window, summed over turns and
        # divided by the window, is the average rate over it. Jobs that ended before the
        # window cannot have points in it, which keeps the scan small.
        cutoff = now - timedelta(seconds=STEPS_RATE_WINDOW_SECONDS)
        recent_jobs = Job.objects.filter(
            Q(state__in=[JobState.RUNNING, JobState.PAUSED]) | Q(finished_at__gte=cutoff)
        ).values("pk")
        spans = (
            MetricPoint.objects.filter(job__in=recent_jobs, time__gte=cutoff, time__lte=now)
            .order_by()
            .values("turn")
            .annotate(first=Min("step"), last=Max("step"))
            .values_list("first", "last")
        )
        gained = sum(last - first for first, last in spans)
        return GaugeMetricFamily(
            "medsplit_steps_per_second",
            f"Training steps per second over all turns, averaged over the last "
            f"{STEPS_RATE_WINDOW_SECONDS} s (from the turns' stored progress points).",
            value=gained / STEPS_RATE_WINDOW_SECONDS,
        )

    def _hospitals(self, now: datetime) -> Iterator[Metric]:
        # The selector the dashboard's hospital list uses, so "online" means the same here.
        rows = (
            hospital_list(actor=Actor.system())
            .order_by()
            .values("status", "online")
            .annotate(n=Count("pk"))
        )
        by_status = dict.fromkeys(Hospital.Status.values, 0)
        by_presence = dict.fromkeys(PRESENCES, 0)
        for row in rows:
            by_status[row["status"]] += row["n"]
            if row["status"] != Hospital.Status.ENROLLED:
                by_presence["not_enrolled"] += row["n"]
            else:
                by_presence["online" if row["online"] else "offline"] += row["n"]
        presence = GaugeMetricFamily(
            "medsplit_hospitals",
            "Hospitals: enrolled and online (heard from within MEDSPLIT_OFFLINE_AFTER), "
            "enrolled and offline, or not enrolled.",
            labels=["state"],
        )
        for name, n in by_presence.items():
            presence.add_metric([name], n)
        yield presence
        status = GaugeMetricFamily(
            "medsplit_hospitals_by_status", "Hospitals in each status.", labels=["status"]
        )
        for name, n in by_status.items():
            status.add_metric([name], n)
        yield status

    def _broker(self) -> Iterator[Metric]:
        depths = queue_lengths(self.broker_url, self.queues)
        up = GaugeMetricFamily(
            "medsplit_broker_up", "Whether the Celery broker answered this scrape (1) or not (0)."
        )
        up.add_metric([], 0 if depths is None else 1)
        yield up
        if depths is not None:  # no made-up 0 when the broker is away
            length = GaugeMetricFamily(
                "medsplit_celery_queue_length",
                "Celery tasks waiting in each queue of the broker (not yet taken by a worker).",
                labels=["queue"],
            )
            for queue, depth in depths.items():
                length.add_metric([queue], depth)
            yield length
        consumers = queue_consumers(self.queues)
        if consumers is not None:
            live = GaugeMetricFamily(
                "medsplit_celery_queue_consumers",
                "Live workers consuming each queue (their heartbeats); 0: tasks sent there "
                "wait for ever.",
                labels=["queue"],
            )
            for queue, n in consumers.items():
                live.add_metric([queue], n)
            yield live


def queue_lengths(broker_url: str, queues: Sequence[str]) -> dict[str, int] | None:
    """Tasks waiting in each Celery queue of ``queues`` on Redis broker ``broker_url``;
    ``None`` if the broker cannot be asked (away, refused, or not a Redis URL)."""
    # Kombu keeps a Redis queue as one list per priority step: the queue's own name for
    # priority 0, "<queue><sep><step>" for the others.
    # Under kombu's global_keyprefix (the deployment's, coordinator/settings.py).
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    keys = [
        (queue, prefix + (f"{queue}{KombuRedisChannel.sep}{step}" if step else queue))
        for queue in queues
        for step in PRIORITY_STEPS
    ]
    try:
        client = redis.Redis.from_url(
            _redis_url(broker_url),
            socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
            socket_timeout=BROKER_TIMEOUT_SECONDS,
        )
    except ValueError as e:  # not a URL redis-py understands
        logger.warning("metrics: cannot read the Celery queues: %s", e)
        return None
    try:
        with client.pipeline(transaction=False) as pipe:
            for _, key in keys:
                pipe.llen(key)
            lengths = pipe.execute()
    except (redis.RedisError, OSError) as e:
        logger.warning("metrics: the Celery broker did not answer: %s", e)
        return None
    finally:
        client.close()
    depths = dict.fromkeys(queues, 0)
    for (queue, _), n in zip(keys, lengths, strict=True):
        depths[queue] += n
    return depths


def queue_consumers(queues: Sequence[str]) -> dict[str, int] | None:
    """How many live workers consume each of ``queues`` (their heartbeats on the relay,
    ``workers/queue_heartbeat.py``); ``None`` if the relay cannot be asked."""
    keys = relay_keys()
    try:
        client = connect(
            settings.MEDSPLIT["REDIS_URL"],
            socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
            socket_timeout=BROKER_TIMEOUT_SECONDS,
        )
    except ValueError as e:  # not a URL redis-py understands
        logger.warning("cannot read the workers' queue heartbeats: %s", e)
        return None
    try:
        found = [
            k.decode() if isinstance(k, bytes) else k
            for k in client.scan_iter(match=keys.worker_queues_pattern(), count=1000)
        ]
    except (redis.RedisError, OSError) as e:
        logger.warning("cannot read the workers' queue heartbeats: %s", e)
        return None
    finally:
        client.close()
    consumers = dict.fromkeys(queues, 0)
    for key in found:
        queue = keys.queue_of(key)
        if queue is not None:
            consumers[queue] = consumers.get(queue, 0) + 1
    return consumers


def celery_queues() -> list[str]:
    """The default queue and every queue a task is routed to (``CELERY_TASK_ROUTES``)."""
    queues = [settings.CELERY_TASK_DEFAULT_QUEUE]
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    if isinstance(routes, dict):  # a router function or list would need Celery to resolve
        for route in routes.values():
            queue = route.get("queue") if isinstance(route, dict) else None
            if isinstance(queue, str) and queue and queue not in queues:
                queues.append(queue)
    return queues


def _redis_url(broker_url: str) -> str:
    # Celery names a unix-socket Redis "redis+socket://"; redis-py calls it "unix://".
    if broker_url.startswith("redis+socket://"):
        return "unix://" + broker_url.removeprefix("redis+socket://")
    return broker_url


def consortium_registry(*, now: datetime | None = None) -> CollectorRegistry:
    """A registry holding only :class:`ConsortiumCollector` over this coordinator's settings
    (no process metrics: they would describe one gunicorn process of several)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        ConsortiumCollector(broker_url=settings.CELERY_BROKER_URL, queues=celery_queues(), now=now)
    )
    return registry
