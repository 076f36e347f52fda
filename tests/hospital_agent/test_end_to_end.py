"""End to end with real processes: the coordinator (a live server), the real Redis with a
user per hospital, a Celery worker and beat, and three agent processes, each with its own
third of BreastMNIST's training split: two U-shaped rounds, and one vanilla round with an
agent killed mid-turn.

The job completes; the final front (and head) and server weights equal unsplit training
over the same batch sequence (`torch.equal`); every agent holds the final weights; no
Redis key, checkpoint or coordinator table holds the bytes of a training image; in
U-shaped mode no label crossed (the audit log lists what crossed, by name and dtype).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from django.apps import apps
from django.core import serializers as django_serializers
from django.core.cache import cache
from django.core.management import call_command

from audit.models import AuditEvent
from hospital_agent.data import DataSource, load_local, prepare
from hospitals import services as hospital_services
from hospitals.models import Hospital
from hospitals.relay_acl import relay_keys
from kernel.actors import Actor
from medsplit.data import synthetic_split
from medsplit.protocol.handoff import import_parties
from medsplit.training.reference import train_unsplit
from medsplit.training.setup import client_parties, server_party
from medsplit.training.verify import deterministic
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.workers.processes import (
    Processes,
    processes,
    wait_evaluated,
    wait_until,
    workers_relay_user,
)
from training import services
from training.models import Job, Turn
from training.runs import checkpoint_dir
from training.states import JobState
from workers.turn_runner import job_model

__all__ = ["processes"]

BREAST = Path(
    os.environ.get(
        "MEDSPLIT_BREASTMNIST",
        Path(__file__).resolve().parents[3] / "shared" / "data" / "breastmnist_28.npz",
    )
)
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def thirds(folder: Path) -> list[Path]:
    """BreastMNIST's training split cut in three MedMNIST-format files, one per agent.

    Where the shared datasets are absent (a bare clone), synthetic grey images in the
    same format stand in, so every invariant here is still tested.
    """
    archive = np.load(BREAST, allow_pickle=False) if BREAST.exists() else _synthetic_archive()
    images, labels = archive["train_images"], archive["train_labels"]
    paths = []
    for i in range(3):
        path = folder / f"breast-third-{i}.npz"
        np.savez(
            path,
            **{
                "train_images": images[i::3],
                "train_labels": labels[i::3],
                "val_images": archive["val_images"][:8],
                "val_labels": archive["val_labels"][:8],
                "test_images": archive["test_images"][:8],
                "test_labels": archive["test_labels"][:8],
            },
        )
        paths.append(path)
    return paths


def _synthetic_archive() -> dict[str, np.ndarray]:
    data = synthetic_split(546 + 16 + 16, shape=(1, 28, 28), seed=5)
    images = (data.images[:, 0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    labels = data.labels.numpy().reshape(-1, 1)
    return {
        "train_images": images[:546],
        "train_labels": labels[:546],
        "val_images": images[546:562],
        "val_labels": labels[546:562],
        "test_images": images[562:],
        "test_labels": labels[562:],
    }


def start_agent(processes: Processes, name: str, env: dict[str, str]):
    processes.env_for[name] = {**processes.env, **env}
    return processes.start(
        name, [sys.executable, "-m", "hospital_agent", "run"], env=processes.env_for[name]
    )


@pytest.fixture
def consortium(live_server, settings, redis_url: str, admin_actor: Actor):
    if not redis_url.startswith("redis://"):
        pytest.skip("per-hospital Redis users need a Redis reached over TCP")
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": redis_url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
    }
    admin = redis.Redis.from_url(redis_url)
    before = set(admin.execute_command("ACL", "USERS"))
    # The live server shares this process's cache, where the throttles count: every test
    # starts with none, whatever enrolled from 127.0.0.1 in the same minute before it.
    cache.clear()
    yield live_server.url
    # The hospitals' Redis users this test made (the shared Redis keeps them otherwise).
    for user in set(admin.execute_command("ACL", "USERS")) - before:
        if user.startswith(f"{settings.MEDSPLIT['RELAY_PREFIX']}-hospital-".encode()):
            admin.execute_command("ACL", "DELUSER", user)
    admin.close()


def enrol_agents(processes: Processes, url: str, tmp_path: Path, admin_actor: Actor, files):
    """Register three hospitals and start an agent for each, on its own third."""
    tag = uuid.uuid4().hex[:6]
    hospitals = []
    for i, path in enumerate(files):
        registration = hospital_services.hospital_register(
            actor=admin_actor, name=f"Hospital {tag} {i}", slug=f"h{tag}-{i}"
        )
        hospitals.append(registration.hospital)
        start_agent(
            processes,
            f"agent-{i}",
            {
                "MEDSPLIT_AGENT_COORDINATOR_URL": url,
                "MEDSPLIT_AGENT_WORK_DIR": str(tmp_path / f"agent-{i}"),
                "MEDSPLIT_AGENT_ENROLMENT_CODE": registration.enrolment_code.plaintext,
                "MEDSPLIT_AGENT_DATA_KIND": "medmnist",
                "MEDSPLIT_AGENT_DATA_PATH": str(path),
                "MEDSPLIT_AGENT_POLL_SECONDS": "2",
                "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "1",
                "MEDSPLIT_AGENT_REPLY_TIMEOUT": "120",
            },
        )
    wait_until(
        "every agent to enrol and report its data",
        lambda: (
            Hospital.objects.filter(pk__in=[h.pk for h in hospitals], status="enrolled")
            .exclude(dataset_summary={})
            .count()
            == 3
        ),
        60,
        processes,
    )
    return hospitals, int(tag, 16) % 1000


def job_for(admin_actor: Actor, hospitals, seed: int, mode: str, **overrides) -> Job:
    cuts = ["pool1"] if mode == "vanilla" else ["pool1", "pool"]
    data = {
        "name": f"breast {mode}",
        "model": "small_cnn",
        "num_classes": 2,
        "mode": mode,
        "cuts": cuts,
        "client_optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "server_optimizer": {"name": "adam", "lr": 0.001},
        "batch_size": 32,
        "rounds": 2,
        "seed": seed,
        "participants": [{"hospital": h.slug} for h in hospitals],
        **overrides,
    }
    job = services.job_create(actor=admin_actor, data=data)
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)


def finals_of(tmp_path: Path, job: Job) -> list[Path]:
    return [
        tmp_path / f"agent-{i}" / "jobs" / f"job-{job.pk}" / "final.safetensors" for i in range(3)
    ]


def wait_for_the_end(processes: Processes, job: Job, finals: list[Path]) -> None:
    """Until the job completed, every agent keeps its final weights and the evaluation the
    job's completion started has ended: then the processes can be stopped, before the
    workers' Redis user is removed (a worker without it retries until it is killed, the
    teardown's whole grace period)."""
    wait_until("the job to complete", lambda: _state(job) == JobState.COMPLETED, 300, processes)
    wait_until(
        "every agent to keep the final weights",
        lambda: all(p.exists() for p in finals),
        60,
        processes,
    )
    wait_evaluated(processes, job)


def prepared_trains(job: Job, files: list[Path]):
    model = job_model(job)
    trains = []
    for path in files:
        data, _ = load_local(
            DataSource(kind="medmnist", path=str(path)),
            input_shape=model.input_shape,
            num_classes=2,
        )
        trains.append(prepare(data, input_shape=model.input_shape, num_classes=2).train)
    return trains


def assert_exact(job: Job, trains, final: Path) -> None:
    """The job's server weights and a hospital's final weights equal unsplit training."""
    job.refresh_from_db()
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    with deterministic():
        want = train_unsplit(model.build(), trains, config, split).state_dict()
    server = server_party(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    clients = client_parties(split, config)
    import_parties(final.read_bytes(), clients)
    got = dict(server.module.state_dict())
    for party in clients.values():
        got.update(party.module.state_dict())
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{name} differs from unsplit training"


def test_three_agents_train_two_rounds_exactly_and_keep_their_data_home(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    """U-shaped, so neither an image nor a label leaves a hospital (vanilla's labels going
    up is checked by the killed-agent test below, a vanilla job)."""
    mode = "ushaped"
    files = thirds(tmp_path)
    hospitals, seed = enrol_agents(processes, consortium, tmp_path, admin_actor, files)
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker")
        processes.celery_beat()
        job = job_for(admin_actor, hospitals, seed, mode)
        finals = finals_of(tmp_path, job)
        wait_for_the_end(processes, job, finals)
        processes.stop_all()  # while the workers' Redis user exists (wait_for_the_end)

    turns = Turn.objects.filter(job=job)
    assert turns.count() == 6 and set(turns.values_list("status", flat=True)) == {"completed"}
    assert all("val_accuracy" in t.metrics for t in turns)
    # The training loss has a source with the loss at home too: each hospital's own
    # report of it (hospital_agent/loss_report.py), for its dashboard.
    with_loss = [t for t in turns if t.last_loss is not None]
    assert len(with_loss) >= 5, [(t.pk, t.last_loss) for t in turns]
    for path in finals:
        assert path.stat().st_mode & 0o777 == 0o600
    assert len({p.read_bytes() for p in finals}) == 1, "every hospital holds the same final weights"
    trains = prepared_trains(job, files)
    assert_exact(job, trains, finals[0])
    _assert_weights_listed(job, hospitals)

    # Data stays home: no image's bytes anywhere outside the agents.
    needles = _image_needles(files, trains)
    haystacks = _relay_values(redis_url, job) + _checkpoint_files() + [_coordinator_tables()]
    for hay in haystacks:
        for needle in needles:
            assert needle not in hay, "a training image's bytes left a hospital"
    finished = AuditEvent.objects.filter(job_id=job.pk, action="turn.finished")
    for event in finished:
        up = event.details["crossed"]["up"]
        assert not any("labels" in tensors for tensors in up.values()), up


def test_an_agent_killed_mid_turn_comes_back_and_the_job_stays_exact(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    files = thirds(tmp_path)
    hospitals, seed = enrol_agents(processes, consortium, tmp_path, admin_actor, files)
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker")
        processes.celery_beat()
        # Smaller batches and two local epochs: turns long enough to be cut in the middle.
        # Augmented: the resumed turn must draw each step's transforms as the unsplit
        # reference does (seeded per step, medsplit.training.augment). One round: the
        # resumed turn is handed on to the third hospital's; a second round adds nothing
        # to a resume (the test above trains two).
        job = job_for(
            admin_actor,
            hospitals,
            seed,
            "vanilla",
            rounds=1,
            batch_size=16,
            local_epochs=2,
            augmentation=[{"name": "flip"}, {"name": "rotate", "degrees": 15}],
        )
        # Five steps served means the hospital has sent step 4, so it holds its snapshot
        # before step 3 (checkpoints every 3) and the resume must start there; at three
        # served, it may still wait on the answer that snapshot needs (resuming at 0).
        busy = wait_until(
            "the second hospital's turn to be under way",
            lambda: (
                Turn.objects.filter(job=job, position=1, status="running", steps__gte=5)
                .exclude(steps__gte=15)
                .first()
            ),
            120,
            processes,
        )
        processes.stop("agent-1", signal.SIGKILL)
        # Restarted with the same work directory: its key, token and snapshots are there.
        processes.start(
            "agent-1",
            [sys.executable, "-m", "hospital_agent", "run"],
            env=processes.env_for["agent-1"],
        )
        finals = finals_of(tmp_path, job)
        wait_for_the_end(processes, job, finals)
        processes.stop_all()  # while the workers' Redis user exists (wait_for_the_end)
    busy.refresh_from_db()
    assert busy.status == "completed" and busy.attempt == 1, "the turn was not failed or redone"
    # Both the restart and the resumed turn are on the record (issue 15).
    resumed = AuditEvent.objects.filter(action="turn.resumed", target=f"turn:{busy.pk}").first()
    assert resumed is not None and resumed.details["step"] >= 3, "the resumed turn left no trace"
    slug = busy.hospital.slug
    assert AuditEvent.objects.filter(action="agent.started", hospital=slug).count() == 2
    assert job.training_config().augmentation, "the job trained augmented"
    assert_exact(job, prepared_trains(job, files), finals[1])
    # Vanilla: the labels went up with the activations, every turn.
    for event in AuditEvent.objects.filter(job_id=job.pk, action="turn.finished"):
        up = event.details["crossed"]["up"]
        assert any("labels" in tensors for tensors in up.values()), up
    log = (processes.folder / "agent-1.log").read_text()
    assert "enrolled as" in log and log.count("enrolled as") == 1, "enrolled once, not again"


def _assert_weights_listed(job: Job, hospitals) -> None:
    """`manage.py job_weights` names every part of the finished job: the server segment's
    file by the digest of its bytes, and each hospital's sealed part."""
    out = io.StringIO()
    call_command("job_weights", str(job.pk), "--json", stdout=out)
    parts = json.loads(out.getvalue())
    server = [p for p in parts if p["party"] == "workers"]
    assert len(server) == 1
    data = Path(server[0]["where"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == server[0]["sha256"]
    assert server[0]["size_bytes"] == len(data)
    assert {p["party"] for p in parts} == {"workers"} | {h.slug for h in hospitals}


def _state(job: Job) -> str:
    job.refresh_from_db()
    assert job.state not in (JobState.FAILED, JobState.CANCELLED), job.state_reason
    return job.state


def _image_needles(files: list[Path], trains) -> list[bytes]:
    """Some training images as raw bytes (uint8, as stored) and as the float32 the model saw."""
    needles = []
    for path, train in zip(files, trains, strict=True):
        images = np.load(path)["train_images"]
        needles += [images[i].tobytes() for i in range(0, len(images), 17)]
        needles += [
            train.images[i].numpy().astype(np.float32).tobytes() for i in range(0, len(train), 17)
        ]
    return needles


def _relay_values(redis_url: str, job: Job) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    values = []
    try:
        prefix = relay_keys().prefix
        tag = f"{{job-{job.pk}}}"
        for pattern in (f"{prefix}:hospital:*{tag}*", f"{prefix}:mail:*{tag}*"):
            for key in client.scan_iter(match=pattern):
                kind = client.type(key)
                if kind == b"string":
                    values.append(client.get(key))
                elif kind == b"stream":
                    values += [b"".join(f.values()) for _, f in client.xrange(key)]
                elif kind == b"hash":
                    values.append(b"".join(client.hgetall(key).values()))
    finally:
        client.close()
    return values


def _checkpoint_files() -> list[bytes]:
    return [p.read_bytes() for p in checkpoint_dir().rglob("*") if p.is_file()]


def _coordinator_tables() -> bytes:
    out = io.StringIO()
    for model in apps.get_models():
        out.write(django_serializers.serialize("json", model.objects.all()))
    return out.getvalue().encode()
