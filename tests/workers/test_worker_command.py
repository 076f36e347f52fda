"""The worker command written in docs/deploy.md and docker-compose.yml starts, as the
workers' own Redis user, on a relay started by deploy/redis-start.sh, consumes its queue
and says so (its queue heartbeat), and a queue nobody consumes shows.

Before: ``celery -A workers.celery_app worker --concurrency 2 -l INFO`` exited at start
under that user (``NoPermissionError ... LLEN <uuid>.reply.celery.pidbox``), and a job
sat "scheduled" for 11 minutes while the coordinator showed nothing wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from django.test import override_settings

from hospitals.relay_acl import RedisAclUsers, relay_keys
from monitoring.collectors import queue_consumers
from tests.security.relay import DeployedRelay
from tests.workers.processes import Processes, database_url, wait_until

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def documented_commands() -> dict[str, list[str]]:
    """The worker's command line in docs/deploy.md and in docker-compose.yml."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    line = next(
        m.group(1)
        for m in re.finditer(
            r"^\.venv/bin/(celery -A workers\.celery_app worker[^#\n]*)", doc, re.M
        )
    )
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return {
        "docs/deploy.md": shlex.split(line),
        "docker-compose.yml": shlex.split(compose["services"]["worker"]["command"]),
    }


def test_the_documented_lines_are_one_and_the_same() -> None:
    commands = documented_commands()
    assert commands["docs/deploy.md"] == commands["docker-compose.yml"]
    assert "--without-mingle" in commands["docs/deploy.md"]


@pytest.mark.parametrize("source", ["docs/deploy.md"])
def test_the_documented_worker_command_starts_as_the_workers_user(
    source: str, tmp_path: Path, settings
) -> None:
    relay = DeployedRelay(tmp_path / "relay")
    (tmp_path / "relay").mkdir()
    relay.start()
    try:
        prefix = f"t{uuid.uuid4().hex[:8]}"
        user, password = f"{prefix}-workers", secrets.token_urlsafe(32)
        with override_settings(MEDSPLIT={**settings.MEDSPLIT, "RELAY_PREFIX": prefix}):
            RedisAclUsers(relay.admin_url).provision_workers(
                username=user, password_sha256=hashlib.sha256(password.encode()).hexdigest()
            )
        workers_url = relay.url_for(user, password)
        queue = f"celery-{uuid.uuid4().hex[:8]}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REDIS_URL": relay.admin_url,
            "MEDSPLIT_WORKER_REDIS_URL": workers_url,
            "CELERY_BROKER_URL": workers_url,
            "MEDSPLIT_RELAY_PREFIX": prefix,
            "MEDSPLIT_CELERY_QUEUE": queue,
            "MEDSPLIT_DATA_DIR": str(tmp_path / "data"),
            "PYTHONPATH": f"{REPO}:{REPO / 'platform'}",
        }
        processes = Processes(tmp_path, env)
        command = documented_commands()[source]
        assert command[0] == "celery"
        worker = processes.start("worker", [sys.executable, "-m", *command])
        medsplit = {
            **settings.MEDSPLIT,
            "REDIS_URL": relay.admin_url,
            "RELAY_PREFIX": prefix,
        }
        with override_settings(MEDSPLIT=medsplit):

            def consumed() -> bool:
                counts = queue_consumers([queue, "nobody-reads-this"])
                return bool(counts) and counts[queue] >= 1

            wait_until("the worker to say it consumes its queue", consumed, 90, processes)
            assert worker.poll() is None, "the documented command stays up"
            assert queue_consumers([queue, "nobody-reads-this"])["nobody-reads-this"] == 0
            processes.stop("worker")
            assert queue_consumers([queue])[queue] == 0, "a stopped worker says so at once"
        log = (tmp_path / "worker.log").read_text()
        assert "NoPermissionError" not in log and "Unrecoverable error" not in log
        assert relay_keys().prefix  # the session's own prefix was left alone
    finally:
        relay.stop()
