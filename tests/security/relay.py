"""The relay as docs/deploy.md runs it, for the attacker tests: ``redis-server`` started by
``deploy/redis-start.sh`` (users in an ACL file, the memory backstops), with a password of
its own, and hospitals' users made by the coordinator's real provisioner."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from hospitals.relay_acl import RedisAclUsers, relay_username
from medsplit.channel import RelayKeys
from tests.workers.processes import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class DeployedRelay:
    """A relay started as the deployment starts it."""

    folder: Path
    maxmemory: str = "512mb"
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    process: subprocess.Popen | None = None

    @property
    def admin_url(self) -> str:
        return f"redis://default:{self.password}@127.0.0.1:{self.port}/0"

    def url_for(self, username: str, password: str) -> str:
        return f"redis://{username}:{password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server on this machine (Debian's redis-server package)")
        env = {
            **os.environ,
            "REDIS_PASSWORD": self.password,
            "REDIS_ACL_FILE": str(self.folder / "users.acl"),
            "REDIS_SERVER": binary,
            "REDIS_MAXMEMORY": self.maxmemory,
        }
        log = open(self.folder / "relay.log", "ab")  # noqa: SIM115 - the process keeps it
        self.process = subprocess.Popen(
            [
                *("sh", str(REPO / "deploy" / "redis-start.sh"), "--port", str(self.port)),
                *("--bind", "127.0.0.1", "--dir", str(self.folder)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.admin().ping():
                    return
            except redis.RedisError:
                assert self.process.poll() is None, (self.folder / "relay.log").read_text()
                time.sleep(0.05)
        raise RuntimeError("the relay did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def admin(self) -> redis.Redis:
        return redis.Redis.from_url(self.admin_url, socket_timeout=5)

    def hospital(self, slug: str, keys: RelayKeys) -> redis.Redis:
        """Provision ``slug``'s user with the coordinator's provisioner; connect as it."""
        password = secrets.token_urlsafe(32)
        username = relay_username(slug, keys)  # under the keys' prefix, like its keys
        with override_prefix(keys.prefix):
            RedisAclUsers(self.admin_url).provision(
                username=username,
                password_sha256=hashlib.sha256(password.encode()).hexdigest(),
                slug=slug,
            )
        return redis.Redis.from_url(self.url_for(username, password), socket_timeout=5)


def override_prefix(prefix: str):
    from django.conf import settings
    from django.test import override_settings

    return override_settings(MEDSPLIT={**settings.MEDSPLIT, "RELAY_PREFIX": prefix})


@pytest.fixture(scope="module")
def deployed_relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedRelay]:
    relay = DeployedRelay(tmp_path_factory.mktemp("relay"))
    relay.start()
    yield relay
    relay.stop()
