"""Hand-offs stay closed against a dishonest coordinator and a key stolen later.

Real components throughout: the coordinator's API on a live server with its real services,
a real Redis relay with a user per hospital (the coordinator's ACL provisioner), and the
agents' own code (enrolment, pins, per-job keys, sealing, the relay) in this process; the
move of a hospital enrolled before identity keys is made by a real agent process. The
dishonest coordinator is played by changing what its database hands out.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from django.utils import timezone

from audit.models import AuditEvent
from hospital_agent.cli import main
from hospital_agent.config import AgentConfig, load_config
from hospital_agent.coordinator import Backoff, Coordinator
from hospital_agent.enrolment import enrol
from hospital_agent.identity import load_or_create_identity, write_private
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import PeerKeyRefused
from hospital_agent.turns import Assignment, TurnTaker
from hospitals import services as hospital_services
from hospitals.models import Hospital
from hospitals.relay_acl import relay_keys
from kernel.actors import Actor
from medsplit.errors import SealError
from medsplit.protocol.keys import (
    RecipientKey,
    SignedRecipientKey,
    fingerprint,
    format_fingerprint,
    generate_identity_key,
    identity_public_b64,
)
from medsplit.protocol.sealing import SealContext, seal, unseal
from tests.hospital_agent.test_end_to_end import consortium
from tests.platform_apps.conftest import issue_agent_token
from tests.platform_apps.training.conftest import report
from tests.workers.processes import Processes, processes, wait_until
from training import services
from training.models import HandOff, Job, JobParticipant
from training.scheduling import job_advance
from training.states import JobState

__all__ = ["consortium", "processes"]

pytestmark = pytest.mark.django_db(transaction=True)

WEIGHTS = b"the weights of a turn"


@dataclass
class Agent:
    """One hospital's agent, made of the agent's own parts, in this process."""

    hospital: Hospital
    config: AgentConfig
    identity: MLDSA65PrivateKey
    taker: TurnTaker

    @property
    def slug(self) -> str:
        return self.hospital.slug

    def assignment(self, job: Job) -> Assignment:
        raw, _ = self.taker.coordinator.assignments()
        return Assignment(next(a for a in raw if a["job"] == job.pk))


def agent_config(url: str, work_dir: Path, code: str = "") -> AgentConfig:
    env = {
        "MEDSPLIT_AGENT_COORDINATOR_URL": url,
        "MEDSPLIT_AGENT_WORK_DIR": str(work_dir),
        "MEDSPLIT_AGENT_ENROLMENT_CODE": code,
        "MEDSPLIT_AGENT_DATA_KIND": "synthetic",
        "MEDSPLIT_AGENT_DATA_SAMPLES": "40",
        "MEDSPLIT_AGENT_REPLY_TIMEOUT": "5",
    }
    return load_config(file=None, flags={}, env=env)


def enrolled_agent(url: str, work_dir: Path, hospital: Hospital, code: str) -> Agent:
    config = agent_config(url, work_dir, code)
    identity = load_or_create_identity(work_dir)
    credentials = enrol(config, identity)
    coordinator = Coordinator(url, token=credentials.token, backoff=Backoff(give_up_after=5))
    taker = TurnTaker(
        config=config,
        credentials=credentials,
        identity=identity,
        coordinator=coordinator,
        stopping=threading.Event(),
    )
    hospital.refresh_from_db()
    return Agent(report(hospital), config, identity, taker)


def two_agents(url: str, tmp_path: Path, admin_actor: Actor) -> tuple[Agent, Agent]:
    tag = uuid.uuid4().hex[:6]
    agents = []
    for name in ("a", "b"):
        registration = hospital_services.hospital_register(
            actor=admin_actor, name=f"Hospital {tag} {name}", slug=f"h{tag}-{name}"
        )
        code = registration.enrolment_code.plaintext
        agents.append(enrolled_agent(url, tmp_path / name, registration.hospital, code))
    return agents[0], agents[1]


def scheduled_job(admin_actor: Actor, *hospitals: Hospital) -> Job:
    job = services.job_create(
        actor=admin_actor,
        data={
            "model": "small_cnn",
            "num_classes": 2,
            "cuts": ["pool1"],
            "participants": [{"hospital": h.slug} for h in hospitals],
        },
    )
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)


def mail_key(job: Job, sender: Agent, recipient: Agent) -> str:
    return relay_keys().mail(f"job-{job.pk}", sender=sender.slug, recipient=recipient.slug)


def admin_relay(redis_url: str) -> redis.Redis:
    """The relay as the coordinator's (or anyone's with its password) admin connection."""
    return redis.Redis.from_url(redis_url)


def published_key(agent: Agent, job: Job) -> SignedRecipientKey:
    row = JobParticipant.objects.get(job=job, hospital=agent.hospital)
    data = {"key": row.recipient_key, "signature": row.recipient_key_signature}
    return SignedRecipientKey.from_json(job=f"job-{job.pk}", hospital=agent.slug, data=data)


def a_hands_off_to_b(a: Agent, b: Agent, job: Job) -> None:
    """Both agents publish their keys and pin each other; A takes its turn and hands on."""
    for agent in (a, b):
        agent.taker.prepare(agent.assignment(job))
    turn = job_advance(job_id=job.pk)
    assert turn is not None and turn.hospital_id == a.hospital.pk
    assignment = a.assignment(job)
    a.taker.hand_on(assignment, assignment.raw["turn"], WEIGHTS)
    services.turn_finish(turn=turn, metrics={})


# -- a dishonest coordinator ---------------------------------------------------------------


def test_a_coordinator_that_swaps_a_hospitals_keys_is_refused_by_the_sender(
    consortium: str, tmp_path: Path, admin_actor: Actor, redis_url: str, caplog
) -> None:
    a, b = two_agents(consortium, tmp_path, admin_actor)
    job = scheduled_job(admin_actor, a.hospital, b.hospital)
    for agent in (a, b):
        agent.taker.prepare(agent.assignment(job))
    assert job_advance(job_id=job.pk) is not None  # A's turn runs

    # The coordinator hands out a per-job key of its own for B, signed by its own identity.
    impostor = generate_identity_key()
    swapped = SignedRecipientKey.sign(
        job=f"job-{job.pk}",
        hospital=b.slug,
        key=RecipientKey.generate().public(),
        identity=impostor,
    )
    JobParticipant.objects.filter(job=job, hospital=b.hospital).update(
        recipient_key=swapped.key.b64(),
        recipient_key_signature=swapped.to_json()["signature"],
        recipient_key_sha256=swapped.key.sha256(),
    )
    assignment = a.assignment(job)
    with caplog.at_level(logging.ERROR), pytest.raises(PeerKeyRefused, match=b.slug):
        a.taker.hand_on(assignment, assignment.raw["turn"], WEIGHTS)
    assert "is not signed by its pinned identity key" in caplog.text

    # It swaps B's identity key as well, without a re-enrolment to show for it.
    Hospital.objects.filter(pk=b.hospital.pk).update(
        identity_key=identity_public_b64(impostor), identity_fingerprint=fingerprint(impostor)
    )
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(PeerKeyRefused):
        a.taker.hand_on(a.assignment(job), assignment.raw["turn"], WEIGHTS)
    assert "with no re-enrolment to show for it" in caplog.text
    assert format_fingerprint(fingerprint(b.identity)) in caplog.text, "the pinned one is named"

    # Nothing was sealed for the impostor; and B's own agent sees its hospital swapped.
    assert not HandOff.objects.filter(job=job).exists()
    assert admin_relay(redis_url).exists(mail_key(job, a, b)) == 0
    with pytest.raises(PeerKeyRefused, match="not this agent's own"):
        b.taker.prepare(b.assignment(job))


def test_a_blob_the_coordinator_seals_in_a_hospitals_name_is_refused_by_the_recipient(
    consortium: str, tmp_path: Path, admin_actor: Actor, redis_url: str
) -> None:
    a, b = two_agents(consortium, tmp_path, admin_actor)
    job = scheduled_job(admin_actor, a.hospital, b.hospital)
    a_hands_off_to_b(a, b, job)
    assignment = b.assignment(job)
    assert b.taker.start_state(assignment, assignment.config(), None, wait=5) == WEIGHTS

    # The coordinator knows B's per-job public key: it seals poisoned weights to it in A's
    # name, signed by an identity of its own, puts them on the relay and records their hash.
    forger = generate_identity_key()
    forged = seal(
        b"poisoned weights",
        sender=forger,
        recipient=published_key(b, job),
        recipient_identity=b.identity.public_key(),
        context=SealContext(job=f"job-{job.pk}", round=0, sender=a.slug, recipient=b.slug),
    )
    admin_relay(redis_url).set(mail_key(job, a, b), forged)
    HandOff.objects.filter(job=job, recipient=b.hospital).update(
        ciphertext_sha256=hashlib.sha256(forged).hexdigest()
    )
    assignment = b.assignment(job)
    with pytest.raises(SealError, match=f"not the one pinned for '{a.slug}'"):
        b.taker.start_state(assignment, assignment.config(), None, wait=5)

    # And with A's identity key swapped for its own, with no re-enrolment: the pin refuses.
    Hospital.objects.filter(pk=a.hospital.pk).update(
        identity_key=identity_public_b64(forger), identity_fingerprint=fingerprint(forger)
    )
    assignment = b.assignment(job)
    with pytest.raises(PeerKeyRefused, match="no re-enrolment to show for it"):
        b.taker.start_state(assignment, assignment.config(), None, wait=5)


# -- a key stolen after the job --------------------------------------------------------------


def test_a_stolen_identity_key_after_the_job_opens_no_recorded_hand_off(
    consortium: str, tmp_path: Path, admin_actor: Actor, redis_url: str
) -> None:
    a, b = two_agents(consortium, tmp_path, admin_actor)
    job = scheduled_job(admin_actor, a.hospital, b.hospital)
    a_hands_off_to_b(a, b, job)
    # Someone records the blob on the relay (or in transit), to open it years later.
    recorded = admin_relay(redis_url).get(mail_key(job, a, b))
    context = SealContext(job=f"job-{job.pk}", round=0, sender=a.slug, recipient=b.slug)
    during = JobKeys(b.config.work_dir).load(job.pk)
    assert unseal(recorded, recipient=during, sender=a.identity.public_key(), context=context) == (
        WEIGHTS
    ), "while the job runs, B's per-job key opens it"

    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED, finished_at=timezone.now())
    b.taker.finish(b.assignment(job))
    final = b.config.work_dir / "jobs" / f"job-{job.pk}" / "final.safetensors"
    assert final.read_bytes() == WEIGHTS, "B kept the final weights first"
    assert not JobKeys(b.config.work_dir).path(job.pk).exists()

    # Later the thief takes B's whole work directory: identity key, token, pins, weights.
    stolen = [p for p in b.config.work_dir.rglob("*") if p.is_file()]
    assert {"identity.key", "credentials.json", "peers.json"} <= {p.name for p in stolen}
    for path in stolen:
        data = path.read_bytes()
        for start in range(0, max(len(data) - 96, 0) + 1, 32):
            try:
                candidate = RecipientKey.from_bytes(data[start : start + 96])
            except (SealError, ValueError):
                continue
            with pytest.raises(SealError):
                unseal(
                    recorded, recipient=candidate, sender=a.identity.public_key(), context=context
                )
    # The per-job key's bytes are nowhere in the work directory any more; the identity key
    # left there signs, and decrypts nothing.
    assert during.to_bytes() not in b"".join(p.read_bytes() for p in stolen)


# -- a re-enrolment, seen by the peers ---------------------------------------------------------


def test_a_peer_that_publishes_its_key_late_is_sealed_for_once_it_has(
    consortium: str, tmp_path: Path, admin_actor: Actor, redis_url: str
) -> None:
    """A's turn ends before B published its per-job key: A waits for it (long-polling,
    woken by the publication), then seals for B's key and records the blob."""
    a, b = two_agents(consortium, tmp_path, admin_actor)
    job = scheduled_job(admin_actor, a.hospital, b.hospital)
    a.taker.prepare(a.assignment(job))
    turn = job_advance(job_id=job.pk)
    assert turn is not None and turn.hospital_id == a.hospital.pk
    assignment = a.assignment(job)
    assert not assignment.participant(b.slug).get("recipient_key")
    late = threading.Timer(0.5, lambda: b.taker.prepare(b.assignment(job)))
    late.start()
    try:
        a.taker.hand_on(assignment, assignment.raw["turn"], WEIGHTS)
    finally:
        late.join()
    recorded = HandOff.objects.get(job=job, recipient=b.hospital)
    blob = admin_relay(redis_url).get(mail_key(job, a, b))
    assert blob is not None and hashlib.sha256(blob).hexdigest() == recorded.ciphertext_sha256
    opened = unseal(  # sealed to the key B published
        blob,
        recipient=b.taker.job_keys.load(job.pk),
        sender=a.identity.public_key(),
        context=SealContext(job=f"job-{job.pk}", round=0, sender=a.slug, recipient=b.slug),
    )
    assert opened == WEIGHTS


def test_a_re_enrolment_is_seen_by_the_peers_and_hand_offs_go_to_the_new_key(
    consortium: str, tmp_path: Path, admin_actor: Actor, caplog, capsys
) -> None:
    a, b = two_agents(consortium, tmp_path, admin_actor)
    job = scheduled_job(admin_actor, a.hospital, b.hospital)
    for agent in (a, b):
        agent.taker.prepare(agent.assignment(job))

    # B's agent is reinstalled: a new work directory, a fresh code from an admin.
    code = hospital_services.enrolment_code_issue(actor=admin_actor, hospital=b.hospital)
    b2 = enrolled_agent(consortium, tmp_path / "b-reinstalled", b.hospital, code.plaintext)
    assert b2.hospital.identity_generation == 2
    replaced = AuditEvent.objects.get(action="identity.replaced", hospital=b.slug)
    assert replaced.details["previous_fingerprint"] == fingerprint(b.identity)
    shown = a.assignment(job).participant(b.slug)
    assert shown["identity_generation"] == 2 and shown["recipient_key"] is None, (
        "the key B's old identity signed is no longer handed out"
    )

    b2.taker.prepare(b2.assignment(job))
    with caplog.at_level(logging.WARNING):
        a.taker.prepare(a.assignment(job))
    assert f"IDENTITY CHANGED: {b.slug} re-enrolled (generation 1 -> 2" in caplog.text
    assert format_fingerprint(fingerprint(b2.identity)) in caplog.text

    turn = job_advance(job_id=job.pk)
    assignment = a.assignment(job)
    a.taker.hand_on(assignment, assignment.raw["turn"], WEIGHTS)
    services.turn_finish(turn=turn, metrics={})
    assignment = b2.assignment(job)
    assert b2.taker.start_state(assignment, assignment.config(), None, wait=5) == WEIGHTS

    # `medsplit-agent status` at A shows B's new fingerprint, for comparison out of band.
    flags = ["--coordinator-url", consortium, "--work-dir", str(a.config.work_dir)]
    assert main(["status", *flags, "--data-kind", "synthetic", "--data-samples", "40"]) == 0
    out = capsys.readouterr().out
    assert f"peer {b.slug}:" in out and format_fingerprint(fingerprint(b2.identity)) in out
    assert format_fingerprint(fingerprint(a.identity)) in out
    assert "generation 2" in out


# -- hospitals enrolled today --------------------------------------------------------------


def test_an_agent_enrolled_before_identity_keys_moves_by_itself_and_peers_see_it(
    processes: Processes, consortium: str, tmp_path: Path, admin_actor: Actor
) -> None:
    """A work directory and a database row as the earlier release left them: the agent
    process moves to an identity key at its start, deletes its X25519 key, and publishes
    a per-job key; its peer pins it and seals for it."""
    tag = uuid.uuid4().hex[:6]
    registration = hospital_services.hospital_register(
        actor=admin_actor, name=f"Old {tag}", slug=f"o{tag}"
    )
    old = registration.hospital
    legacy = X25519PrivateKey.generate()
    legacy_public = base64.b64encode(legacy.public_key().public_bytes_raw()).decode()
    Hospital.objects.filter(pk=old.pk).update(status="enrolled", legacy_public_key=legacy_public)
    work = tmp_path / "old"
    write_private(work / "agent.key", legacy.private_bytes_raw())
    credentials = {
        "hospital": old.slug,
        "token": issue_agent_token(old),
        "relay_url": "redis://127.0.0.1:6379/0",
        "relay_username": f"hospital-{old.slug}",
        "relay_password": "unused",
    }
    write_private(work / "credentials.json", json.dumps(credentials).encode())
    env = {
        **processes.env,
        "MEDSPLIT_AGENT_COORDINATOR_URL": consortium,
        "MEDSPLIT_AGENT_WORK_DIR": str(work),
        "MEDSPLIT_AGENT_DATA_KIND": "synthetic",
        "MEDSPLIT_AGENT_DATA_SAMPLES": "40",
        "MEDSPLIT_AGENT_POLL_SECONDS": "1",
        "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "1",
    }
    processes.start("old", [sys.executable, "-m", "hospital_agent", "run"], env=env)

    def moved() -> bool:
        old.refresh_from_db()
        return old.identity_generation == 1 and bool(old.dataset_summary)

    wait_until("the old agent to move to an identity key", moved, 60, processes)
    assert not (work / "agent.key").exists(), "the X25519 key is deleted"
    assert json.loads((work / "credentials.json").read_text())["identity_generation"] == 1
    event = AuditEvent.objects.get(action="identity.replaced", hospital=old.slug)
    assert event.details["legacy_public_key"] == legacy_public
    assert old.legacy_public_key == legacy_public, "kept for the record"

    registration = hospital_services.hospital_register(
        actor=admin_actor, name=f"New {tag}", slug=f"n{tag}"
    )
    new = enrolled_agent(
        consortium, tmp_path / "new", registration.hospital, registration.enrolment_code.plaintext
    )
    job = scheduled_job(admin_actor, new.hospital, old)
    wait_until(
        "the old agent to publish its per-job key",
        lambda: (
            JobParticipant.objects.filter(job=job, hospital=old).exclude(recipient_key="").exists()
        ),
        30,
        processes,
    )
    new.taker.prepare(new.assignment(job))
    assert new.assignment(job).participant(old.slug)["identity_fingerprint"] == (
        old.identity_fingerprint
    )
    turn = job_advance(job_id=job.pk)
    assignment = new.assignment(job)
    new.taker.hand_on(assignment, assignment.raw["turn"], WEIGHTS)
    assert HandOff.objects.filter(turn=turn, recipient=old).exists()
    log = (processes.folder / "old.log").read_text()
    assert "moved to an ML-DSA-65 identity key" in log and "agent.key is deleted" in log
