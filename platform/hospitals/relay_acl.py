"""The hook that creates and removes each hospital's Redis ACL user on the relay.

A hospital's agent talks to the relay as its own Redis user, which may touch only the
keys of its own streams (invariant 3). The coordinator decides the user name, the
password (of which it keeps only the SHA-256, the form ``ACL SETUSER ... #<hex>`` takes)
and the key patterns; a :class:`RedisAclProvisioner` applies them to the relay.

The provisioner is chosen by ``settings.MEDSPLIT["REDIS_ACL_PROVISIONER"]`` (a dotted
path to a class built without arguments). The default, :class:`NoRelayProvisioner`,
only logs that no relay is configured: the real one comes with the Redis runtime.

Services call the provisioner inside their transaction, last: if it raises
:class:`~hospitals.errors.RelayProvisioningFailed`, the enrolment or revocation is
rolled back whole and the caller may retry.

The real provisioner, :class:`RedisAclUsers`, applies these rules with ``ACL SETUSER``.
The key layout is :mod:`medsplit.channel.keys` (``<prefix>`` is
``settings.MEDSPLIT["RELAY_PREFIX"]``); what a hospital ``<slug>`` may do with each family
of keys (Redis 7 selectors, each with its own commands):

- its streams ``<prefix>:hospital:<slug>:{job}:<topic>:up|down``: the stream commands
  only (``XADD XREAD XREADGROUP XACK XGROUP CREATE XPENDING XRANGE XREVRANGE XLEN XDEL
  XTRIM XINFO STREAM``), on keys ending
  in ``:up`` or ``:down`` under ``<prefix>:hospital:<slug>:``;
- their counters ``...:up:seq`` and ``...:down:seq``: ``HGET HSET HINCRBY`` only;
- blobs it sends, ``<prefix>:mail:to:{recipient}:from:<slug>:{job}:<topic>``: write and
  delete only (``SET DEL``);
- blobs addressed to it, ``<prefix>:mail:to:<slug>:from:{sender}:{job}:<topic>``: read
  only (``GET EXISTS``);
- another hospital's keys, Celery's keys, anything else: nothing.

So a hospital can neither ``SET`` strings nor ``HSET`` hashes of its own choosing under its
prefix: what it can store is bounded by what its streams and sent blobs hold, and the
workers check those against the job's limits (``workers/relay_guard.py``). The patterns
are anchored so that no slug reaches another's keys, whatever the slugs are (the module
docstring of :mod:`medsplit.channel.keys` says why; ``tests/security/test_relay_keys.py``
proves it against a real Redis). Outside the selectors the user may run only ``PING``
and ``MULTI EXEC DISCARD`` (the channel appends and consumes atomically; each queued
command is still checked against the selectors). No scripts (``EVAL``, ``EVALSHA``,
``SCRIPT``, ``FUNCTION``): a script that loops would stall the relay for every hospital
until ``lua-time-limit``. ``AUTH`` and ``HELLO`` need no rule. No pub/sub channels.

The workers (Celery) use their own user, see :meth:`RedisAclUsers.provision_workers`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import redis
from django.conf import settings
from django.utils.module_loading import import_string

from hospitals.errors import RelayProvisioningFailed
from medsplit.channel.connect import RelayClient, connect, every_node
from medsplit.channel.keys import RelayKeys

logger = logging.getLogger(__name__)

DEFAULT_PROVISIONER = "hospitals.relay_acl.NoRelayProvisioner"


def relay_keys() -> RelayKeys:
    """This deployment's relay key layout (``MEDSPLIT["RELAY_PREFIX"]``)."""
    return RelayKeys(settings.MEDSPLIT["RELAY_PREFIX"])


def relay_username(slug: str, keys: RelayKeys | None = None) -> str:
    """The Redis user of hospital ``slug``: ``<prefix>-hospital-<slug>``, under the
    deployment's relay prefix like its keys, so that deployments (or demos, or test runs)
    sharing one Redis never reuse or remove each other's users."""
    return f"{(keys or relay_keys()).prefix}-hospital-{slug}"


def legacy_relay_username(slug: str) -> str:
    """The name hospitals enrolled before user names carried the prefix were given (their
    agents still log in with it, so their users keep it until they enrol again)."""
    return f"hospital-{slug}"


def workers_username(keys: RelayKeys | None = None) -> str:
    """The default Redis user of the workers: ``<prefix>-workers``."""
    return f"{(keys or relay_keys()).prefix}-workers"


def relay_key_pattern(slug: str) -> str:
    """The keys of hospital ``slug``'s streams (what its enrolment shows it)."""
    return relay_keys().hospital_streams_pattern(slug)


@runtime_checkable
class RedisAclProvisioner(Protocol):
    """Applies a hospital's relay user to Redis. Both methods are idempotent."""

    def provision(self, *, username: str, password_sha256: str, slug: str) -> None:
        """Create or replace ``username``: this password only, hospital ``slug``'s keys only.

        Raises:
            RelayProvisioningFailed: the relay refused or could not be reached.
        """
        ...

    def revoke(self, *, username: str) -> None:
        """Remove ``username`` and drop its connections; a missing user is not an error.

        Raises:
            RelayProvisioningFailed: the relay refused or could not be reached.
        """
        ...

    def suspend(self, *, username: str, slug: str) -> int:
        """Switch ``username`` off, drop its connections and delete what hospital ``slug``
        stored (its streams and the blobs it sent, not those addressed to it); providing
        the user again lifts it. Returns how many keys went.

        Raises:
            RelayProvisioningFailed: the relay refused or could not be reached.
        """
        ...


class NoRelayProvisioner:
    """The default: no relay is configured, so there is nothing to apply; says so."""

    def provision(self, *, username: str, password_sha256: str, slug: str) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s (hospital %s) was not created",
            username,
            slug,
        )

    def revoke(self, *, username: str) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s was not removed", username
        )

    def suspend(self, *, username: str, slug: str) -> int:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s was not suspended", username
        )
        return 0


def get_provisioner() -> RedisAclProvisioner:
    """The configured provisioner (read at each call, so settings overrides apply)."""
    path = settings.MEDSPLIT.get("REDIS_ACL_PROVISIONER") or DEFAULT_PROVISIONER
    provisioner = import_string(path)()
    if not isinstance(provisioner, RedisAclProvisioner):
        raise TypeError(f"MEDSPLIT['REDIS_ACL_PROVISIONER'] = {path!r} is not a provisioner")
    return provisioner


# -- the real provisioner ---------------------------------------------------------------

#: Commands an agent's user may run outside any key (``-@all`` first).
AGENT_COMMANDS = ("ping", "multi", "exec", "discard")
#: ... and on a Redis Cluster, what redis-py's cluster client asks as it starts: the slot
#: map and the command table (both the same for every user, naming no key).
CLUSTER_COMMANDS = ("cluster|slots", "cluster|shards", "command")
#: ... on its own streams (``xinfo|stream`` is the subcommand form ACL rules take); a
#: reader takes frames through the stream's consumer group (``medsplit.channel.redis``).
STREAM_COMMANDS = (
    "xadd",
    "xread",
    "xreadgroup",
    "xack",
    "xgroup|create",
    "xpending",
    "xrange",
    "xrevrange",
    "xlen",
    "xdel",
    "xtrim",
    "xinfo|stream",
)
#: ... on its streams' counters (``medsplit.channel.redis``).
COUNTER_COMMANDS = ("hget", "hset", "hincrby")
#: ... on blobs it sends, and on blobs addressed to it.
SEND_COMMANDS = ("set", "del")
RECEIVE_COMMANDS = ("get", "exists")
#: Redis 6 has no selectors: every command on every pattern.
_REDIS6_COMMANDS = (
    *AGENT_COMMANDS,
    *STREAM_COMMANDS,
    *COUNTER_COMMANDS,
    *SEND_COMMANDS,
    *RECEIVE_COMMANDS,
)

_SLUG = r"([a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?)"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def worker_key_patterns(keys: RelayKeys | None = None) -> tuple[str, ...]:
    """Every key the workers reach: the deployment's, relay keys and Celery's alike
    (kombu's ``global_keyprefix`` is :meth:`RelayKeys.celery_prefix`, see the settings)."""
    return ((keys or relay_keys()).deployment_pattern(),)


def hospital_key_rules(
    slug: str, keys: RelayKeys | None = None, *, selectors: bool = True
) -> list[str]:
    """The key rules of hospital ``slug`` (see the module docstring).

    With ``selectors`` (Redis 7), one selector per family of keys, each with its own
    commands. Without (Redis 6 has no selectors and no ``%R~``/``%W~``), plain ``~``
    patterns for the same keys, every agent command on each: the hospital may then also
    read what it sent and write what is addressed to it, and store other values under its
    own keys, which only harms itself (every blob is sealed by its sender, so anything
    else is refused on opening) and which the workers' relay guard still bounds.
    """
    keys = keys or relay_keys()
    own = keys.hospital_prefix(slug)
    streams = [f"~{own}*:up", f"~{own}*:down"]
    counters = [f"~{own}*:seq"]
    sent, received = keys.outbox_pattern(slug), keys.inbox_pattern(slug)
    if not selectors:
        return [f"~{keys.hospital_streams_pattern(slug)}", f"~{sent}", f"~{received}"]

    def selector(patterns: Sequence[str], commands: Sequence[str]) -> str:
        return "(" + " ".join([*patterns, *(f"+{c}" for c in commands)]) + ")"

    return [
        selector(streams, STREAM_COMMANDS),
        selector(counters, COUNTER_COMMANDS),
        selector([f"%W~{sent}"], SEND_COMMANDS),
        selector([f"%R~{received}"], RECEIVE_COMMANDS),
    ]


def agent_acl_rules(
    *,
    username: str,
    password_sha256: str,
    keys: RelayKeys | None = None,
    selectors: bool = True,
    cluster: bool = False,
) -> list[str]:
    """The arguments of ``ACL SETUSER`` after the user name, for a hospital's agent
    (``selectors``: see :func:`hospital_key_rules`; ``cluster``: a node of a Redis Cluster,
    where the agent's client must also learn the slots, :data:`CLUSTER_COMMANDS`).

    Raises:
        ValueError: not a hospital user name, or not a SHA-256 (so nothing can smuggle
            in another ACL rule).
    """
    keys = keys or relay_keys()
    match = re.fullmatch(rf"{re.escape(keys.prefix)}-hospital-{_SLUG}", username) or (
        re.fullmatch(rf"hospital-{_SLUG}", username)  # legacy_relay_username
    )
    if match is None:
        raise ValueError(f"{username!r} is not a hospital relay user name of this deployment")
    _check_digest(password_sha256)
    commands = AGENT_COMMANDS if selectors else _REDIS6_COMMANDS
    if cluster:
        commands = (*commands, *CLUSTER_COMMANDS)
    return [
        "reset",
        "on",
        f"#{password_sha256}",
        "resetchannels",
        "-@all",
        *(f"+{c}" for c in commands),
        *hospital_key_rules(match.group(1), keys, selectors=selectors),
    ]


def worker_acl_rules(*, password_sha256: str) -> list[str]:
    """The arguments of ``ACL SETUSER`` after the user name, for the workers (Celery).

    Every command but the ``@admin`` and ``@dangerous`` ones (no ``ACL``, ``CONFIG``,
    ``KEYS``, ``FLUSHDB``, ``CLIENT KILL``, ``DEBUG``...), on :func:`worker_key_patterns`
    only, and every pub/sub channel (Celery's result backend and kombu's fan-out
    subscribe).
    """
    _check_digest(password_sha256)
    return [
        "reset",
        "on",
        f"#{password_sha256}",
        "resetchannels",
        "&*",
        *(f"~{p}" for p in worker_key_patterns()),
        "+@all",
        "-@admin",
        "-@dangerous",
    ]


def _check_digest(password_sha256: str) -> None:
    if not _SHA256_HEX.match(password_sha256):
        raise ValueError("the password must be given as 64 lower-case hex digits (SHA-256)")


class RedisAclUsers:
    """The real provisioner: ACL users on the relay at ``url`` (default
    ``settings.MEDSPLIT["REDIS_URL"]``, whose credentials are the coordinator's admin
    ones and need the ``ACL`` and ``CLIENT`` commands).

    On a Redis Cluster (a ``redis+cluster://`` URL) every node keeps its own users, so
    each change is applied to every node the cluster lists, replicas included (one may be
    promoted); a node that refuses fails the whole change, which is idempotent and retried
    whole. A node added later gets the users with ``manage.py relay_users_restore``.

    Any Redis failure (unreachable, refused, not allowed) becomes
    :class:`~hospitals.errors.RelayProvisioningFailed`, naming host and port only.
    """

    def __init__(self, url: str | None = None, *, timeout_s: float = 5.0) -> None:
        self._url = url or settings.MEDSPLIT["REDIS_URL"]
        self._timeout_s = timeout_s
        self._clustered = False

    def _admin(self) -> RelayClient:
        try:
            return connect(
                self._url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s
            )
        except redis.RedisError as e:  # a cluster client asks for the slots at once
            raise RelayProvisioningFailed(f"the relay cluster could not be reached: {e}") from e

    def _where(self, client: RelayClient) -> str:
        if not isinstance(client, redis.Redis):
            return "cluster " + ",".join(sorted(n.name for n in client.get_nodes()))
        kwargs = client.connection_pool.connection_kwargs
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"

    def _failed(self, client: RelayClient, action: str, e: redis.RedisError):
        # The error's own text never holds the password; the URL is not quoted.
        return RelayProvisioningFailed(
            f"the relay at {self._where(client)} could not {action}: {type(e).__name__}: {e}"
        )

    def provision(self, *, username: str, password_sha256: str, slug: str) -> None:
        if username not in (relay_username(slug), legacy_relay_username(slug)):
            raise ValueError(f"relay user {username!r} is not hospital {slug!r}'s")

        def rules(client: redis.Redis) -> list[str]:
            return agent_acl_rules(
                username=username,
                password_sha256=password_sha256,
                selectors=self._has_selectors(client),
                cluster=self._clustered,
            )

        self._setuser(username, rules)

    def provision_workers(self, *, username: str, password_sha256: str) -> None:
        """Create or replace the workers' own user (see :func:`worker_acl_rules`)."""
        self._setuser(username, lambda _: worker_acl_rules(password_sha256=password_sha256))

    def _setuser(self, username: str, rules: Callable[[redis.Redis], list[str]]) -> None:
        client = self._admin()
        self._clustered = not isinstance(client, redis.Redis)
        try:
            for node in every_node(client):
                node.execute_command("ACL", "SETUSER", username, *rules(node))
                self._save(node)
        except redis.RedisError as e:
            raise self._failed(client, f"create relay user {username}", e) from e
        finally:
            client.close()
        logger.info("relay user %s provisioned", username)

    def _has_selectors(self, client: redis.Redis) -> bool:
        version = str(client.info("server")["redis_version"])
        if int(version.split(".")[0]) >= 7:
            return True
        logger.warning(
            "the relay runs Redis %s, which has no read-only or write-only key rules "
            "(7.0 has): hospitals' hand-off keys are read-write for their own user, and "
            "only the seal protects them",
            version,
        )
        return False

    def _save(self, client: redis.Redis) -> None:
        """``ACL SAVE`` where Redis keeps its users in an ACL file, so that they survive
        a restart of a relay that keeps no data; a Redis without one has nothing to save."""
        try:
            client.execute_command("ACL", "SAVE")
        except redis.ResponseError as e:
            if "acl file" not in str(e).lower():
                raise
            logger.debug("the relay keeps no ACL file; users last until it restarts")

    def _kill_clients(self, node: redis.Redis, username: str) -> None:
        """``CLIENT KILL USER`` on ``node``; a user the node does not know is not an error."""
        try:
            node.execute_command("CLIENT", "KILL", "USER", username)
        except redis.ResponseError as e:
            if "no such user" not in str(e).lower():
                raise

    def revoke(self, *, username: str) -> None:
        """``ACL DELUSER`` (which on Redis 7 also disconnects the user's clients), then
        ``CLIENT KILL USER`` for any connection left; a missing user is not an error."""
        client = self._admin()
        deleted = 0
        try:
            for node in every_node(client):
                deleted += node.execute_command("ACL", "DELUSER", username)
                self._save(node)
                self._kill_clients(node, username)
        except redis.RedisError as e:
            raise self._failed(client, f"remove relay user {username}", e) from e
        finally:
            client.close()
        logger.info("relay user %s revoked (existed: %s)", username, bool(deleted))

    def suspend(self, *, username: str, slug: str) -> int:
        """``ACL SETUSER <user> off`` (which ends its open connections on Redis 7), then
        ``CLIENT KILL USER`` for any left, then delete the hospital's streams and the blobs
        it sent, so that the relay's memory comes back at once."""
        keys = relay_keys()
        client = self._admin()
        deleted = 0
        try:
            for node in every_node(client):
                node.execute_command("ACL", "SETUSER", username, "off")
                self._save(node)
                self._kill_clients(node, username)
            # On a cluster SCAN visits every primary, and each key is deleted on its own.
            for pattern in (keys.hospital_streams_pattern(slug), keys.outbox_pattern(slug)):
                for key in client.scan_iter(match=pattern, count=1000):
                    deleted += client.delete(key)
        except redis.RedisError as e:
            raise self._failed(client, f"suspend relay user {username}", e) from e
        finally:
            client.close()
        logger.warning("relay user %s suspended; %d of its keys deleted", username, deleted)
        return deleted
