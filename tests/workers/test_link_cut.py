"""A hospital whose network link is cut, with real processes, over TLS as deployed.

The second hospital's agent runs in a network namespace of its own (:mod:`tests.workers.netns`):
it reaches this host only over a veth pair, at the host's end of it, where nginx terminates
TLS in front of the coordinator (docs/deploy.md, "TLS") and the relay serves ``rediss://``;
both certificates come from a consortium CA of the test's own, which every agent checks
with its ``ca_bundle``. The workers reach the relay on this host.

* The link cut for 30 s in the middle of the hospital's turn, then restored: the job
  completes, in the same attempt, and its weights equal unsplit training exactly
  (``torch.equal``): no step lost, none applied twice.
* The link cut for good: the turn fails once the hospital has sent nothing for the
  deployment's silence timeout (``MEDSPLIT_TURN_SILENCE``), and the job's policy (skip)
  applies: the job goes on without the hospital and completes, its weights equal to
  unsplit training over the other hospitals' data.

Skipped, saying why, where network namespaces cannot be made (not root, no iproute2, a
container that forbids them) or nginx is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.core.cache import cache

from kernel.actors import Actor
from tests.workers import netns
from tests.workers.agents import (
    Agents,
    ConsortiumCA,
    Relay,
    TlsProxy,
    assert_every_handoff_recorded,
    assert_exact,
    audit,
    job_state,
    make_ca,
    running,
    small_job,
    wait_completed,
)
from tests.workers.processes import Processes, processes, wait_until, workers_relay_user
from training.models import Job, Turn
from training.states import JobState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

__all__ = ["processes"]

CUT_SECONDS = 30.0
#: Past the cut and the agent's reconnecting (its backoff doubles up to 16 s by then).
SILENCE_OVER_A_CUT = 90
SILENCE_FOR_GOOD = 8


@pytest.fixture
def link() -> Iterator[netns.Link]:
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"no network namespace for the hospital: {reason}")
    with netns.link() as made:
        yield made


@pytest.fixture
def ca(tmp_path: Path, link: netns.Link) -> ConsortiumCA:
    folder = tmp_path / "tls"
    folder.mkdir()
    return make_ca(folder, [link.host_ip, "127.0.0.1"])


@pytest.fixture
def relay(tmp_path: Path, link: netns.Link, ca: ConsortiumCA) -> Iterator[Relay]:
    folder = tmp_path / "relay"
    folder.mkdir()
    with running(Relay(folder, tls=ca, bind=("127.0.0.1", link.host_ip))) as relay:
        yield relay


@pytest.fixture
def coordinator(
    live_server, settings, tmp_path: Path, link: netns.Link, ca: ConsortiumCA, relay: Relay
) -> Iterator[str]:
    """The coordinator behind nginx with TLS at the host's end of the link; it hands the
    agents the relay's ``rediss://`` address there."""
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": relay.url,
        "WORKER_REDIS_URL": relay.url,
        "RELAY_URL": relay.tls_url(link.host_ip),
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
    }
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, link.host_ip]
    cache.clear()  # the live server's throttles
    upstream = urlsplit(live_server.url)
    folder = tmp_path / "nginx"
    folder.mkdir()
    proxy = TlsProxy(folder, link.host_ip, f"127.0.0.1:{upstream.port}", ca)
    proxy.start()
    try:
        yield proxy.url
    finally:
        proxy.stop()


def start(
    processes: Processes,
    coordinator: str,
    relay: Relay,
    link: netns.Link,
    ca: ConsortiumCA,
    tmp_path: Path,
    admin_actor: Actor,
    *,
    silence: int,
) -> Agents:
    """Two hospitals, the second in the namespace; a worker and beat on this host."""
    processes.env.update(
        REDIS_URL=relay.url, CELERY_BROKER_URL=relay.url, MEDSPLIT_TURN_SILENCE=str(silence)
    )
    agents = Agents(processes, coordinator, tmp_path).enrol(
        admin_actor, 2, prefix={1: link.prefix}, extra={"MEDSPLIT_AGENT_CA_BUNDLE": str(ca.ca)}
    )
    processes.celery_worker("worker")
    processes.celery_beat()
    return agents


def cut_mid_turn(processes: Processes, job: Job, link: netns.Link) -> float:
    """Cut the link once the second hospital is three steps into its turn; when."""
    wait_until(
        "the second hospital's turn to be three steps in",
        lambda: Turn.objects.filter(job=job, position=1, status="running", steps__gte=3).exists(),
        120,
        processes,
    )
    link.cut()
    return time.monotonic()


def test_a_link_cut_for_30_s_mid_turn_loses_no_step_and_applies_none_twice(
    processes: Processes,
    coordinator: str,
    relay: Relay,
    link: netns.Link,
    ca: ConsortiumCA,
    tmp_path: Path,
    admin_actor: Actor,
) -> None:
    with workers_relay_user(relay.url, processes):
        agents = start(
            processes, coordinator, relay, link, ca, tmp_path, admin_actor,
            silence=SILENCE_OVER_A_CUT,
        )  # fmt: skip
        job = small_job(admin_actor, agents.hospitals)
        cut_mid_turn(processes, job, link)
        time.sleep(CUT_SECONDS)
        link.restore()
        wait_completed(processes, job, agents, 240)

    turns = Turn.objects.filter(job=job)
    assert sorted(turns.values_list("status", flat=True)) == ["completed"] * 2, (
        "no attempt failed: " + "; ".join(turns.values_list("failure_reason", flat=True))
    )
    assert_exact(job, agents)
    assert_every_handoff_recorded(job)
    cut = turns.get(position=1)
    assert any(e.target == f"turn:{cut.pk}" for e in audit(job, "turn.resumed")), (
        "the audit log shows the turn going on after the link came back"
    )
    log = (processes.folder / "agent-1.log").read_text()
    assert "https://" in log and "relay:" in log, "over TLS, and it saw the relay go away"


def test_a_link_that_stays_down_fails_the_turn_after_the_silence_and_the_policy_applies(
    processes: Processes,
    coordinator: str,
    relay: Relay,
    link: netns.Link,
    ca: ConsortiumCA,
    tmp_path: Path,
    admin_actor: Actor,
) -> None:
    with workers_relay_user(relay.url, processes):
        agents = start(
            processes, coordinator, relay, link, ca, tmp_path, admin_actor,
            silence=SILENCE_FOR_GOOD,
        )  # fmt: skip
        job = small_job(admin_actor, agents.hospitals, on_failure="skip", max_retries=0)
        cut_at = cut_mid_turn(processes, job, link)
        failed = wait_until(
            "the cut hospital's turn to fail",
            lambda: Turn.objects.filter(job=job, position=1, status="skipped").first(),
            120,
            processes,
        )
        failed_after = time.monotonic() - cut_at
        state = wait_until("the job to end", lambda: job_state(job), 120, processes)

    assert "sent nothing for" in failed.failure_reason, failed.failure_reason
    assert failed_after >= SILENCE_FOR_GOOD - 1, f"failed {failed_after:.1f} s after the cut"
    assert state == JobState.COMPLETED, job.state_reason
    reasons = [e.details.get("reason", "") for e in audit(job, "turn.failed")]
    assert len(reasons) == 1 and "HospitalSilent" in reasons[0], reasons
    assert Turn.objects.get(job=job, position=0).status == Turn.Status.COMPLETED
    # Skipped: the job kept the first hospital's weights, as unsplit training over its
    # data alone gives them; the cut hospital holds no final weights (its link is down).
    wait_until("the first agent's final weights", agents.final(job, 0).exists, 60, processes)
    assert_exact(job, agents, hospitals=[0], skipped=frozenset({1}))
