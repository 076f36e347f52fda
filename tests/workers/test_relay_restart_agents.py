"""The relay restarted in the middle of a turn, with real agent processes.

Three hospitals' agents (``python -m hospital_agent run``), a Celery worker and beat, the
coordinator as a live server, and a Redis of the test's own that keeps only its users (an
ACL file, as deployed). When the second hospital writes step 4's activations, the test
kills that Redis (SIGKILL) and starts it again empty: streams, counters, hand-offs and
queued tasks are gone. The job completes; its weights equal unsplit training exactly
(``torch.equal``): no step lost, none applied twice; every hand-off is recorded; the
senders and readers noticed the relay's loss, and the turn went on in the same attempt.

Where it went on from depends on where each side was when the relay died, and each way is
right: the worker's run ends and the next resumes at step 3, the checkpoint before step 4
(the audit log says "a new run of the server"); the agent finds its stream reset after
the worker's reply already reached the new relay and comes back at a later checkpoint
("the hospital came back"); or nothing was on the relay at that moment (the worker held
the activations, the agent waited), both senders go on numbering from their own counts
and nothing needs resuming. Never does a resume go back before step 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import cache

from kernel.actors import Actor
from tests.workers.agents import (
    Agents,
    FrameTaken,
    Relay,
    RelayTrigger,
    assert_every_handoff_recorded,
    assert_exact,
    audit,
    frozen,
    running,
    small_job,
    wait_completed,
)
from tests.workers.processes import Processes, processes, workers_relay_user
from training.models import Turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

__all__ = ["processes"]

#: The step whose activations the restart follows; checkpoints every 3 steps.
STEP = 4


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    folder = tmp_path / "relay"
    folder.mkdir()
    with running(Relay(folder)) as relay:
        yield relay


@pytest.fixture
def consortium(live_server, settings, relay: Relay, processes: Processes) -> str:
    """The coordinator, provisioning each hospital's relay user on the test's relay."""
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": relay.url,
        "WORKER_REDIS_URL": relay.url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
    }
    processes.env.update(REDIS_URL=relay.url, CELERY_BROKER_URL=relay.url)
    cache.clear()  # the live server's throttles: every agent enrols from 127.0.0.1
    return live_server.url


def test_a_relay_restarted_mid_step_loses_no_step_and_redoes_none_checkpointed(
    processes: Processes, consortium: str, relay: Relay, tmp_path: Path, admin_actor: Actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 3)
    second = agents.hospitals[1]
    with workers_relay_user(relay.url, processes):
        processes.celery_worker("worker")
        processes.celery_beat()
        worker = processes.started["worker"].pid

        def restart_while_the_worker_computes() -> None:
            with frozen(worker):
                relay.restart()

        trigger = RelayTrigger(
            relay.url,
            FrameTaken(relay.url, "activations", f":hospital:{second.slug}:", step=STEP),
            restart_while_the_worker_computes,
        )
        job = small_job(admin_actor, agents.hospitals)
        trigger.wait("the second hospital's step 4", 120, processes)
        wait_completed(processes, job, agents, 240)

    turns = Turn.objects.filter(job=job)
    assert sorted(turns.values_list("status", flat=True)) == ["completed"] * 3, (
        "no attempt failed: " + "; ".join(turns.values_list("failure_reason", flat=True))
    )
    assert_exact(job, agents)
    assert_every_handoff_recorded(job)
    interrupted = turns.get(position=1)
    resumed = [
        e.details for e in audit(job, "turn.resumed") if e.target == f"turn:{interrupted.pk}"
    ]
    # Nothing checkpointed before the restart is redone, whichever way it went on.
    assert all(r["step"] % 3 == 0 and r["step"] >= STEP - STEP % 3 for r in resumed), resumed
    logs = [(processes.folder / f"{name}.log").read_text() for name in ("agent-1", "worker")]
    # A sender found the stream's counter behind its own count, or a reader found the
    # numbering broken; either says why.
    said = ("the relay restarted without its data", "a restart or a reset")
    assert any(why in log for log in logs for why in said), "nobody noticed the restart"
