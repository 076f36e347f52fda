"""Attack: one hospital fills the relay, or sends a frame far larger than its job's.

Before: a hospital stored 250 MiB of junk under its own keys (``SET`` 4 × 32 MiB, ``XADD``
8 × 8 MiB) and nothing noticed; a 270 MiB frame was assembled by the worker (+540 MiB).

Now, against a relay started by ``deploy/redis-start.sh`` with the coordinator's real
users, the real worker (``workers.turn_runner.run``) and the real database rows:

- the rules refuse junk strings and hashes outright;
- what no ACL can refuse (entries on its own stream, blobs "for" others) is measured by the
  worker's relay guard against the job's bounds: the hospital's turn fails with the reason,
  its relay user is suspended (locked out, what it stored deleted, the relay's memory back),
  and the next hospital's turn completes;
- a frame larger than the job's is refused from its first chunk, with the same outcome.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.utils import timezone

from audit.models import AuditEvent
from hospitals import services as hospital_services
from hospitals.models import Hospital, RedisCredential
from hospitals.relay_acl import RedisAclUsers, relay_keys, relay_username
from hospitals.relay_services import relay_user_lift
from kernel.actors import Actor
from tests.security.relay import DeployedRelay, deployed_relay  # noqa: F401 - fixture
from tests.workers.hospitals import Hospitals, local_data
from training import services
from training.models import Job, Turn
from training.scheduling import job_advance
from training.states import JobState
from workers import turn_runner

MiB = 1 << 20
STEPS = 3

platform = pytest.mark.django_db(transaction=True)


@pytest.fixture
def relay_runtime(settings, tmp_path, deployed_relay: DeployedRelay) -> Iterator[DeployedRelay]:  # noqa: F811
    """The coordinator and the workers on the deployed relay, each as its own user."""
    workers, password = f"workers-{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(32)
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": deployed_relay.admin_url,
        "WORKER_REDIS_URL": deployed_relay.url_for(workers, password),
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        "RELAY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "CHECKPOINT_EVERY": 2,
        "TURN_SILENCE_SECONDS": 20.0,
        "TURN_LEASE_SECONDS": 5.0,
        "METRICS_MIN_INTERVAL_SECONDS": 0.0,
        "RELAY_GUARD_SECONDS": 0.0,  # measure at every look at the directive
    }
    RedisAclUsers(deployed_relay.admin_url).provision_workers(  # under this prefix
        username=workers, password_sha256=hashlib.sha256(password.encode()).hexdigest()
    )
    yield deployed_relay
    admin = deployed_relay.admin()
    for key in admin.scan_iter(match=relay_keys().deployment_pattern()):
        admin.delete(key)
    for user in admin.execute_command("ACL", "USERS"):
        if user.decode().startswith((relay_username(""), "workers-")):
            admin.execute_command("ACL", "DELUSER", user)
    admin.close()


def _used_mib(relay: DeployedRelay) -> float:
    client = relay.admin()
    try:
        return int(client.info("memory")["used_memory"]) / MiB
    finally:
        client.close()


def _job_with_relay_users(make_job, admin_actor: Actor) -> tuple[Job, dict[str, str]]:
    """A scheduled three-hospital job whose hospitals have their real relay users; the
    first to take its turn is the hostile one. Returns each hospital's relay password."""
    job = make_job(seed=uuid.uuid4().int % 1000, rounds=1, max_steps_per_turn=STEPS,
                   on_failure="skip")  # fmt: skip
    passwords = {}
    for participant in job.participants.select_related("hospital"):
        relay = hospital_services._provision_relay_user(participant.hospital, timezone.now())
        passwords[participant.hospital.slug] = relay.password
    return job, passwords


def _as_hospital(relay: DeployedRelay, slug: str, password: str) -> redis.Redis:
    return redis.Redis.from_url(relay.url_for(relay_username(slug), password), socket_timeout=30)


def _assert_suspended(relay: DeployedRelay, slug: str, password: str, turn: Turn) -> None:
    credential = RedisCredential.objects.get(hospital__slug=slug)
    assert credential.suspended_at is not None
    assert f"hospital {slug}" in credential.suspended_reason
    assert AuditEvent.objects.filter(action="relay.user_suspended", hospital=slug).exists()
    with pytest.raises(redis.RedisError):
        _as_hospital(relay, slug, password).ping()
    assert turn.status == Turn.Status.SKIPPED, "the job's policy decides: skip the hospital"


def _next_turn_completes(job: Job, relay: DeployedRelay, position: int) -> None:
    """The next hospital's turn, served by the real worker, completes."""
    train, val = local_data(job, 16 * STEPS), local_data(job, 16)
    honest = Hospitals(job, relay.admin_url, train, val, reply_timeout=20)
    following = job_advance(job_id=job.pk)
    assert following is not None and following.position == position
    client = threading.Thread(
        target=honest._turn, args=(0, position, honest.slugs[position]), daemon=True
    )
    client.start()
    assert turn_runner.run(following.pk, runner="security-test").outcome == "completed"
    client.join(20)
    following.refresh_from_db()
    assert following.status == Turn.Status.COMPLETED and following.steps == STEPS


@platform
def test_a_hospital_that_fills_the_relay_is_suspended_and_the_others_go_on(
    relay_runtime: DeployedRelay, make_job, admin_actor: Actor
) -> None:
    relay = relay_runtime
    job, passwords = _job_with_relay_users(make_job, admin_actor)
    slugs = list(job.participants.order_by("position").values_list("hospital__slug", flat=True))
    hostile, keys = slugs[0], relay_keys()
    client = _as_hospital(relay, hostile, passwords[hostile])
    before = _used_mib(relay)

    refused = 0
    for i in range(4):  # junk strings under its own prefix: the rules say no
        try:
            client.set(f"{keys.hospital_prefix(hostile)}junk-{i}", os.urandom(32 * MiB))
        except redis.exceptions.NoPermissionError:
            refused += 1
    assert refused == 4
    stream = keys.streams(f"job-{job.pk}", hostile).up
    for _ in range(8):  # what no ACL can refuse: entries on its own stream...
        client.xadd(stream, {"d": os.urandom(8 * MiB)})
    for other in slugs[1:]:  # ...and blobs "for" the others
        for topic in ("handoff", "psi"):
            blob = keys.mail(f"job-{job.pk}", sender=hostile, recipient=other, topic=topic)
            client.set(blob, os.urandom(32 * MiB))
    filled = _used_mib(relay)
    assert filled - before > 180

    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    turn = job_advance(job_id=job.pk)
    assert turn is not None and turn.hospital.slug == hostile
    assert turn_runner.run(turn.pk, runner="security-test").outcome == "failed"
    turn.refresh_from_db()
    assert f"hospital {hostile} stored" in turn.failure_reason
    assert "beyond what its jobs allow" in turn.failure_reason
    _assert_suspended(relay, hostile, passwords[hostile], turn)
    assert _used_mib(relay) - before < 8, "what it stored was deleted"
    _next_turn_completes(job, relay, 1)

    # Only a consortium admin lifts it; then the same user works again.
    relay_user_lift(actor=admin_actor, hospital=Hospital.objects.get(slug=hostile))
    assert _as_hospital(relay, hostile, passwords[hostile]).ping()


@platform
def test_a_frame_far_larger_than_the_jobs_is_refused_from_its_first_chunk(
    relay_runtime: DeployedRelay, make_job, admin_actor: Actor, settings
) -> None:
    """A batch of 4,096 in a job of 16 (51 MiB at this cut): the first 4 MiB chunk says
    so, and the worker reads no further."""
    settings.MEDSPLIT = {**settings.MEDSPLIT, "RELAY_GUARD_SECONDS": 3600.0}
    relay = relay_runtime
    job, passwords = _job_with_relay_users(make_job, admin_actor)
    hostile = job.participants.order_by("position").first().hospital.slug
    stream = relay_keys().streams(f"job-{job.pk}", hostile).up
    client = _as_hospital(relay, hostile, passwords[hostile])
    chunks = 13  # 13 × 4 MiB
    client.hincrby(f"{stream}:seq", "sent", chunks)
    for i in range(chunks):
        chunk: dict[Any, Any] = {"s": i + 1, "m": 1, "i": i, "n": chunks, "d": os.urandom(4 * MiB)}
        client.xadd(stream, chunk)

    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    turn = job_advance(job_id=job.pk)
    assert turn_runner.run(turn.pk, runner="security-test").outcome == "failed"
    turn.refresh_from_db()
    assert f"{hostile} put too much on the relay" in turn.failure_reason
    assert "13 chunk(s)" in turn.failure_reason and "it was not read" in turn.failure_reason
    _assert_suspended(relay, hostile, passwords[hostile], turn)
    _next_turn_completes(job, relay, 1)


def test_at_its_memory_limit_the_relay_refuses_writes_and_evicts_nothing(tmp_path) -> None:
    """The backstop of deploy/redis-start.sh: maxmemory with noeviction."""
    relay = DeployedRelay(tmp_path, maxmemory="16mb")
    relay.start()
    admin = relay.admin()
    try:
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        admin.set("kept", b"a frame in flight")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(8):
                admin.set(f"filler-{i}", os.urandom(4 * MiB))
        assert admin.get("kept") == b"a frame in flight", "nothing was evicted"
        assert admin.delete(*(f"filler-{i}" for i in range(8))) >= 1, "deletes still work"
    finally:
        admin.close()
        relay.stop()
