"""The link-cut case of ``bench_faults.py`` (see ``fault_matrix.py``): the second
hospital's agent in a network namespace of its own, reaching the coordinator (behind nginx
with TLS) and the relay (``rediss://``) over a veth pair, which is cut for 30 s in the
middle of its turn (step 4) and then restored. Skipped, saying why, where network
namespaces cannot be made or nginx is missing."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fault_matrix import (
    _UNDISTURBED,
    HOSPITALS,
    STEP,
    _fast_passwords,
    _flushable_audit_log,
    _fresh_cache,
    _relay_prefix_of_this_session,
    admin_actor,
    consortium_admin,
    measure,
    processes,
    record,
    redis_url,
)

from tests.workers import netns
from tests.workers.agents import Agents, ConsortiumCA, FrameTaken, Relay, RelayTrigger
from tests.workers.processes import Processes, workers_relay_user
from tests.workers.test_link_cut import ca, coordinator, link, relay
from training.models import Job

pytestmark = [pytest.mark.django_db(transaction=True)]

__all__ = [
    "_UNDISTURBED",
    "_fast_passwords",
    "_flushable_audit_log",
    "_fresh_cache",
    "_relay_prefix_of_this_session",
    "admin_actor",
    "ca",
    "consortium_admin",
    "coordinator",
    "link",
    "processes",
    "redis_url",
    "relay",
]

CUT_SECONDS = 30.0
#: Past the cut and the agent's reconnecting (its backoff doubles up to 16 s by then).
SILENCE = 90


def test_link_cut(
    processes: Processes,
    coordinator: str,
    relay: Relay,
    link: netns.Link,
    ca: ConsortiumCA,
    tmp_path,
    admin_actor,
) -> None:
    processes.env.update(
        REDIS_URL=relay.url,
        CELERY_BROKER_URL=relay.url,
        MEDSPLIT_TURN_SILENCE=str(SILENCE),
        MEDSPLIT_CHECKPOINT_EVERY="3",
    )
    agents = Agents(processes, coordinator, tmp_path).enrol(
        admin_actor,
        HOSPITALS,
        prefix={1: link.prefix},
        extra={"MEDSPLIT_AGENT_CA_BUNDLE": str(ca.ca)},
    )
    up = f":hospital:{agents.hospitals[1].slug}:"
    with workers_relay_user(relay.url, processes):
        processes.celery_worker("worker-1")
        processes.celery_worker("worker-2")
        processes.celery_beat()

        def inject(job: Job, ended: list[float]) -> Callable[[], None]:
            trigger = RelayTrigger(relay.url, FrameTaken("activations", up, step=STEP), link.cut)

            def fired() -> None:
                trigger.wait("the second hospital's step 4", 240, processes)
                time.sleep(CUT_SECONDS)
                link.restore()
                ended.append(time.monotonic())

            return fired

        result = measure("link_cut_30s", processes, relay.url, agents, admin_actor, inject)
    record(result)
    assert result["equal_unsplit"], result
