"""The real relay provisioner against the real Redis: what a hospital's user may touch.

Skipped, with the reason, where no Redis answers at ``MEDSPLIT["REDIS_URL"]`` or it is
older than 7.0 (key-permission selectors). Users are named ``hospital-test-...`` and
``medsplit-test-...``, and removed with every key written, whatever the outcome.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from audit.models import AuditEvent
from hospitals import services
from hospitals.errors import RelayProvisioningFailed
from hospitals.relay_acl import (
    RedisAclUsers,
    agent_acl_rules,
    get_provisioner,
    legacy_relay_username,
    relay_keys,
    relay_username,
)
from kernel.actors import Actor
from medsplit.errors import ChannelError
from tests.platform_apps.conftest import make_hospital
from tests.platform_apps.hospitals.helpers import issue_code, new_identity_key

PROVISIONER = "hospitals.relay_acl.RedisAclUsers"
NO_RETRY = Retry(NoBackoff(), 0)


def _admin_or_skip() -> redis.Redis:
    url = settings.MEDSPLIT["REDIS_URL"]
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        version = client.info("server")["redis_version"]
    except redis.RedisError as e:
        pytest.skip(f"no Redis answers at REDIS_URL ({type(e).__name__}); set REDIS_URL")
    if int(version.split(".")[0]) < 7:
        pytest.skip(f"Redis {version} has no ACL key selectors (%R~ / %W~); needs 7.0")
    return client


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    client = _admin_or_skip()
    yield client
    client.close()


@dataclass
class Agent:
    slug: str
    username: str
    password: str

    def connect(self) -> redis.Redis:
        where = redis.Redis.from_url(settings.MEDSPLIT["REDIS_URL"]).connection_pool
        where = where.connection_kwargs
        return redis.Redis(
            host=where.get("host", "127.0.0.1"),
            port=where.get("port", 6379),
            username=self.username,
            password=self.password,
            socket_timeout=2,
            retry=NO_RETRY,  # redis-py would otherwise retry a cut connection with backoff
        )

    def url(self) -> str:
        where = redis.Redis.from_url(settings.MEDSPLIT["REDIS_URL"]).connection_pool
        where = where.connection_kwargs
        host, port = where.get("host", "127.0.0.1"), where.get("port", 6379)
        return f"redis://{self.username}:{self.password}@{host}:{port}/0"

    def stream(self, job: str = "job-1", direction: str = "up") -> str:
        pair = relay_keys().streams(job, self.slug)
        return pair.up if direction == "up" else pair.down


@pytest.fixture
def agents(admin: redis.Redis) -> Iterator[Callable[[str], Agent]]:
    """Provisions hospitals ``hospital-test-<name>-<random>`` through RedisAclUsers."""
    made: list[Agent] = []
    provisioner = RedisAclUsers()

    def make(name: str) -> Agent:
        slug = f"test-{name}-{uuid.uuid4().hex[:10]}"
        password = secrets.token_urlsafe(24)
        agent = Agent(slug=slug, username=relay_username(slug), password=password)
        made.append(agent)
        provisioner.provision(
            username=agent.username,
            password_sha256=hashlib.sha256(password.encode()).hexdigest(),
            slug=slug,
        )
        return agent

    yield make
    for agent in made:
        admin.execute_command("ACL", "DELUSER", agent.username)
        keys = relay_keys()
        for pattern in (
            keys.hospital_streams_pattern(agent.slug),
            keys.inbox_pattern(agent.slug),
            keys.outbox_pattern(agent.slug),
        ):
            keys = list(admin.scan_iter(match=pattern))
            if keys:
                admin.delete(*keys)


def _denied(call: Callable[[], object]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


def test_the_rules_are_exactly_these() -> None:
    digest = "ab" * 32
    rules = agent_acl_rules(username=relay_username("st-marys"), password_sha256=digest)
    p = settings.MEDSPLIT["RELAY_PREFIX"]
    assert rules == [
        "reset",
        "on",
        f"#{digest}",
        "resetchannels",
        "-@all",
        "+ping",
        "+multi",
        "+exec",
        "+discard",
        f"(~{p}:hospital:st-marys:*:up ~{p}:hospital:st-marys:*:down +xadd +xread "
        "+xreadgroup +xack +xgroup|create +xpending +xrange +xrevrange +xlen +xdel +xtrim "
        "+xinfo|stream)",
        f"(~{p}:hospital:st-marys:*:seq +hget +hset +hincrby)",
        f"(%W~{p}:mail:to:*:from:st-marys:{{* +set +del)",
        f"(%R~{p}:mail:to:st-marys:from:* +get +exists)",
    ]


def test_a_user_named_before_names_carried_the_prefix_keeps_the_same_rules() -> None:
    """Hospitals enrolled before: their agents log in as ``hospital-<slug>``."""
    digest = "ab" * 32
    legacy = agent_acl_rules(username=legacy_relay_username("st-marys"), password_sha256=digest)
    assert legacy == agent_acl_rules(username=relay_username("st-marys"), password_sha256=digest)


@pytest.mark.parametrize(
    ("username", "digest"),
    [
        ("default", "ab" * 32),
        ("{p}-hospital-x", "not-a-digest"),
        ("{p}-hospital-x +@all", "ab" * 32),
        ("{p}-hospital-X", "ab" * 32),
        ("other-hospital-x", "ab" * 32),  # another deployment's
    ],
)
def test_nothing_but_a_hospital_user_and_a_digest_gets_through(
    username: str, digest: str, settings
) -> None:
    username = username.format(p=settings.MEDSPLIT["RELAY_PREFIX"])
    with pytest.raises(ValueError):
        agent_acl_rules(username=username, password_sha256=digest)


def test_an_agent_uses_its_own_streams_and_nothing_of_another(agents) -> None:
    a, b = agents("a"), agents("b")
    conn_a = a.connect()
    try:
        assert conn_a.ping()
        conn_a.xadd(a.stream(), {"frame": b"x"})
        assert conn_a.xread({a.stream(): "0"})[0][1][0][1] == {b"frame": b"x"}
        assert conn_a.xlen(a.stream()) == 1
        assert conn_a.xinfo_stream(a.stream())["length"] == 1
        assert len(conn_a.xrange(a.stream())) == 1
        assert conn_a.xtrim(a.stream(), maxlen=0, approximate=False) == 1

        b.connect().xadd(b.stream("job-1", "down"), {"frame": b"y"})
        for stream in (b.stream("job-1", "up"), b.stream("job-1", "down")):
            _denied(lambda s=stream: conn_a.xadd(s, {"frame": b"z"}))
            _denied(lambda s=stream: conn_a.xread({s: "0"}))
            _denied(lambda s=stream: conn_a.xrange(s))
            _denied(lambda s=stream: conn_a.xlen(s))
        # One forbidden stream among allowed ones refuses the whole read.
        _denied(lambda: conn_a.xread({a.stream(): "0", b.stream("job-1", "down"): "0"}))
        # Its own prefix holds streams and their counters only: no strings, no hashes.
        own = relay_keys().hospital_prefix(a.slug)
        _denied(lambda: conn_a.set(own + "junk", b"x" * 1024))
        _denied(lambda: conn_a.hset(own + "junk", "f", b"x"))
        _denied(lambda: conn_a.hset(a.stream(), "f", b"x"))
    finally:
        conn_a.close()


def test_the_redis_channel_works_with_an_agents_user_on_its_own_streams_only(agents) -> None:
    """The real channel (transactions and the ``:seq`` hash included) under these rules."""
    from medsplit.channel.redis import RedisChannel

    a, b = agents("a"), agents("b")
    channel = RedisChannel(a.url(), socket_timeout=2)
    try:
        channel.send(a.stream("job-1", "up"), b"frame-bytes")
        assert channel.receive(a.stream("job-1", "up"), timeout=1) == b"frame-bytes"
        refused = "no permissions to access one of the keys"
        with pytest.raises(ChannelError, match=refused):
            channel.send(b.stream("job-1", "up"), b"intrusion")
        with pytest.raises(ChannelError, match=refused):
            channel.receive(b.stream("job-1", "down"), timeout=0.2)
    finally:
        channel.close()


def test_hand_offs_are_written_to_others_and_read_only_by_their_recipient(agents) -> None:
    a, b = agents("a"), agents("b")
    conn_a, conn_b = a.connect(), b.connect()
    try:
        keys = relay_keys()
        a_to_b = keys.mail("job-7", sender=a.slug, recipient=b.slug)
        b_to_a = keys.mail("job-7", sender=b.slug, recipient=a.slug)
        assert conn_a.set(a_to_b, b"ciphertext-for-b", ex=60)
        assert conn_b.set(b_to_a, b"ciphertext-for-a", ex=60)

        assert conn_a.get(b_to_a) == b"ciphertext-for-a"  # addressed to A
        assert conn_b.get(a_to_b) == b"ciphertext-for-b"  # addressed to B
        _denied(lambda: conn_a.get(a_to_b))  # A wrote it, but it is B's to read
        _denied(lambda: conn_a.set(b_to_a, b"forged"))  # A cannot write as B
        _denied(lambda: conn_a.delete(b_to_a))  # nor remove what B sent
        # A hand-off between two others is out of reach entirely.
        c_to_b = keys.mail("job-7", sender="c", recipient=b.slug)
        _denied(lambda: conn_a.get(c_to_b))
        _denied(lambda: conn_a.set(c_to_b, b"forged"))
        assert conn_a.delete(a_to_b) == 1  # the sender may withdraw what it sent
    finally:
        conn_a.close()
        conn_b.close()


def test_celery_keys_and_other_commands_are_refused(agents) -> None:
    a = agents("a")
    conn = a.connect()
    try:
        celery = relay_keys().celery_prefix()  # kombu's global_keyprefix
        for key in (
            "celery",
            "_kombu.binding.celery",
            "unacked",
            "celery-task-meta-1",
            f"{celery}celery",
            f"{celery}_kombu.binding.celery",
            f"{celery}unacked",
        ):
            _denied(lambda k=key: conn.get(k))
            _denied(lambda k=key: conn.set(k, b"x"))
        _denied(lambda: conn.lpush("celery", b"task"))  # not even with a pattern it had
        for command in (
            ("KEYS", "*"),
            ("FLUSHDB",),
            ("CONFIG", "GET", "*"),
            ("ACL", "LIST"),
            ("SCAN", "0"),
            # Its channel creates its streams' group; nothing may move or drop one.
            ("XGROUP", "SETID", a.stream(), "medsplit", "$"),
            ("XGROUP", "DESTROY", a.stream(), "medsplit"),
            ("XGROUP", "DELCONSUMER", a.stream(), "medsplit", "reader"),
            ("XCLAIM", a.stream(), "medsplit", "reader", "0", "0-1"),
            ("XAUTOCLAIM", a.stream(), "medsplit", "reader", "0", "0"),
            ("SUBSCRIBE", "x"),
            ("CLIENT", "LIST"),
            ("EVAL", "return 1", "0"),
            # No scripts at all: a looping one would stall the relay for everyone.
            ("SCRIPT", "LOAD", "return 1"),
            ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"),
            ("FUNCTION", "LIST"),
        ):
            _denied(lambda c=command: conn.execute_command(*c))
    finally:
        conn.close()


def test_revocation_cuts_an_open_connection_and_refuses_new_ones(agents) -> None:
    a = agents("a")
    conn = a.connect()
    try:
        conn.xadd(a.stream(), {"frame": b"x"})
        RedisAclUsers().revoke(username=a.username)
        with pytest.raises(
            (redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)
        ):
            conn.xadd(a.stream(), {"frame": b"after"})
        fresh = a.connect()
        with pytest.raises(redis.exceptions.AuthenticationError):
            fresh.ping()
        fresh.close()
        RedisAclUsers().revoke(username=a.username)  # again: a missing user is no error
    finally:
        conn.close()


def test_on_redis_7_deleting_the_user_alone_already_disconnects_it(
    agents, admin: redis.Redis
) -> None:
    """Why revoke's CLIENT KILL USER is only a second belt: ACL DELUSER drops the
    connection by itself."""
    a = agents("a")
    conn = a.connect()
    try:
        assert conn.ping()
        admin.execute_command("ACL", "DELUSER", a.username)
        with pytest.raises(redis.exceptions.ConnectionError):
            conn.ping()
    finally:
        conn.close()


def test_the_workers_user_reaches_streams_hand_offs_and_celery_but_not_admin(
    admin: redis.Redis,
) -> None:
    username = f"medsplit-test-workers-{uuid.uuid4().hex[:10]}"
    password = secrets.token_urlsafe(24)
    RedisAclUsers().provision_workers(
        username=username, password_sha256=hashlib.sha256(password.encode()).hexdigest()
    )
    where = admin.connection_pool.connection_kwargs
    conn = redis.Redis(host=where["host"], port=where["port"], username=username, password=password)
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    keys = [
        relay_keys().streams("job-1", prefix).up,
        relay_keys().mail("job-1", sender=prefix, recipient="x"),
        f"{relay_keys().celery_prefix()}celery-{prefix}",  # kombu's global_keyprefix
    ]
    try:
        conn.xadd(keys[0], {"frame": b"x"})
        conn.set(keys[1], b"y")
        conn.lpush(keys[2], b"task")
        assert conn.xlen(keys[0]) == 1 and conn.get(keys[1]) == b"y"
        _denied(lambda: conn.get(f"other-{prefix}"))
        # Celery's keys without the deployment's prefix are another deployment's.
        _denied(lambda: conn.lpush(f"celery-{prefix}", b"task"))
        _denied(lambda: conn.get(f"_kombu.binding.celery-{prefix}"))
        for command in (("FLUSHDB",), ("CONFIG", "GET", "*"), ("ACL", "LIST"), ("KEYS", "*")):
            _denied(lambda c=command: conn.execute_command(*c))
    finally:
        conn.close()
        admin.delete(*keys)
        admin.execute_command("ACL", "DELUSER", username)


def test_an_unreachable_relay_is_a_relay_error_naming_host_and_port_only() -> None:
    provisioner = RedisAclUsers("redis://someone:s3cret-pw@127.0.0.1:1/0", timeout_s=1)
    with pytest.raises(RelayProvisioningFailed) as caught:
        provisioner.provision(
            username=relay_username("test-x"), password_sha256="ab" * 32, slug="test-x"
        )
    assert "127.0.0.1:1" in caught.value.message
    assert "s3cret-pw" not in caught.value.message
    with pytest.raises(RelayProvisioningFailed):
        provisioner.revoke(username="hospital-test-x")


def test_an_admin_without_acl_rights_is_a_relay_error(admin: redis.Redis, agents) -> None:
    a = agents("a")  # an agent's credentials are certainly not an admin's
    where = admin.connection_pool.connection_kwargs
    url = f"redis://{a.username}:{a.password}@{where['host']}:{where['port']}/0"
    with pytest.raises(RelayProvisioningFailed) as caught:
        RedisAclUsers(url).provision(
            username=relay_username("test-y"), password_sha256="ab" * 32, slug="test-y"
        )
    assert a.password not in caught.value.message
    assert admin.execute_command("ACL", "GETUSER", relay_username("test-y")) is None


@pytest.mark.django_db
def test_enrolment_creates_a_working_user_and_revocation_removes_it(admin: redis.Redis) -> None:
    hospital = make_hospital(f"test-enrol-{uuid.uuid4().hex[:10]}")
    username = relay_username(hospital.slug)
    medsplit = {**settings.MEDSPLIT, "REDIS_ACL_PROVISIONER": PROVISIONER}
    try:
        with override_settings(MEDSPLIT=medsplit):
            assert isinstance(get_provisioner(), RedisAclUsers)
            enrolment = services.agent_enrol(
                code=issue_code(hospital), identity_key=new_identity_key()
            )
            relay = enrolment.relay
            assert relay.username == username
            agent = Agent(slug=hospital.slug, username=relay.username, password=relay.password)
            conn = agent.connect()
            conn.xadd(agent.stream(), {"frame": b"x"})
            assert conn.xlen(agent.stream()) == 1

            result = services.hospital_tokens_revoke(actor=Actor.system(), hospital=hospital)
            assert result.relay_user_revoked
            with pytest.raises(
                (redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)
            ):
                conn.ping()
            conn.close()
            assert admin.execute_command("ACL", "GETUSER", username) is None
    finally:
        admin.execute_command("ACL", "DELUSER", username)
        admin.delete(relay_keys().streams("job-1", hospital.slug).up)


@pytest.mark.django_db
def test_relay_workers_user_command_creates_the_workers_user_and_shows_its_url_once(
    admin: redis.Redis, monkeypatch
) -> None:
    username = f"medsplit-test-workers-{uuid.uuid4().hex[:10]}"
    out = io.StringIO()
    try:
        call_command("relay_workers_user", "--username", username, stdout=out)
        url = out.getvalue().splitlines()[-1].strip()
        assert url.startswith(f"redis://{username}:")
        workers = redis.Redis.from_url(url, socket_timeout=2)
        try:
            assert workers.ping()
            _denied(lambda: workers.execute_command("ACL", "LIST"))
        finally:
            workers.close()
        assert AuditEvent.objects.filter(
            action="relay.workers_user_provisioned", target=f"relay-user:{username}"
        ).exists()
        # 16 characters of every kind, accepted before: about 105 bits, refused now.
        monkeypatch.setenv("SHORT_PASSWORD", "Aa1!Bb2@Cc3#Dd4$")
        with pytest.raises(CommandError, match="too weak to guard the relay"):
            call_command(
                "relay_workers_user", "--username", username, "--password-env", "SHORT_PASSWORD"
            )
    finally:
        admin.execute_command("ACL", "DELUSER", username)
