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

The real provisioner, :class:`RedisAclUsers`, applies these rules with ``ACL SETUSER``:

Key layout and what a hospital ``<slug>`` may do with each key (Redis 7 selectors):

- its streams ``medsplit:{job}:<slug>:up`` and ``...:down``: read and write, rule
  ``~medsplit:*:<slug>:*`` (the pattern the services pass in);
- hand-offs it sends, ``medsplit-handoff:to:{recipient}:from:<slug>:job:{job}``:
  write only, rule ``%W~medsplit-handoff:to:*:from:<slug>:job:*``;
- hand-offs addressed to it, ``medsplit-handoff:to:<slug>:from:{sender}:job:{job}``:
  read only, rule ``%R~medsplit-handoff:to:<slug>:from:*``;
- another hospital's streams, Celery's keys, anything else: nothing.

A hand-off is written (``SET ... EX``) by its sender, addressed to its recipient, and
read (``GET``) only by that recipient; the sender may also ``DEL`` what it sent. The
hand-offs live under their own prefix ``medsplit-handoff:`` so that no stream pattern
``medsplit:*:<slug>:*`` can reach them (a hospital whose slug were ``to`` or ``from``
would otherwise match every hand-off). The recipient comes first, so the read rule is
anchored: slugs hold no ``:`` and no glob characters, so ``to:<slug>:from:`` names one
recipient only, and ``from:<slug>:job:`` one sender only (job ids are the coordinator's
numbers).

Commands: ``-@all`` then only what an agent needs (:data:`AGENT_COMMANDS`): ``PING``,
the stream commands ``XADD XREAD XRANGE XREVRANGE XLEN XDEL XTRIM XINFO STREAM``,
``HGET HSET HINCRBY`` (the sequence hash ``{stream}:seq`` of ``medsplit.channel.redis``),
``MULTI EXEC DISCARD`` (that channel appends and consumes atomically; key rules still
apply to each queued command), and ``GET SET DEL EXISTS`` for hand-offs. No scripts
(``EVAL``, ``EVALSHA``, ``SCRIPT``, ``FUNCTION``): a script that loops would stall the
relay for every hospital until ``lua-time-limit``. ``AUTH`` and
``HELLO`` need no rule (Redis lets every connection authenticate). No pub/sub channels.

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
from medsplit.channel.base import HANDOFF_PREFIX, handoff_key  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

DEFAULT_PROVISIONER = "hospitals.relay_acl.NoRelayProvisioner"


def relay_username(slug: str) -> str:
    """The Redis user of hospital ``slug``."""
    return f"hospital-{slug}"


def relay_key_pattern(slug: str) -> str:
    """The keys hospital ``slug`` may touch: its streams ``medsplit:{job}:{slug}:up|down``."""
    return f"medsplit:*:{slug}:*"


@runtime_checkable
class RedisAclProvisioner(Protocol):
    """Applies a hospital's relay user to Redis. Both methods are idempotent."""

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        """Create or replace ``username``: this password only, these key patterns only.

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


class NoRelayProvisioner:
    """The default: no relay is configured, so there is nothing to apply; says so."""

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s (keys %s) was not created",
            username,
            ", ".join(key_patterns),
        )

    def revoke(self, *, username: str) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s was not removed", username
        )


def get_provisioner() -> RedisAclProvisioner:
    """The configured provisioner (read at each call, so settings overrides apply)."""
    path = settings.MEDSPLIT.get("REDIS_ACL_PROVISIONER") or DEFAULT_PROVISIONER
    provisioner = import_string(path)()
    if not isinstance(provisioner, RedisAclProvisioner):
        raise TypeError(f"MEDSPLIT['REDIS_ACL_PROVISIONER'] = {path!r} is not a provisioner")
    return provisioner


# -- the real provisioner ---------------------------------------------------------------

#: Commands an agent's user may run (``-@all`` first). ``xinfo|stream`` is the
#: subcommand form ACL rules take.
AGENT_COMMANDS = (
    "ping",
    "xadd",
    "xread",
    "xrange",
    "xrevrange",
    "xlen",
    "xdel",
    "xtrim",
    "xinfo|stream",
    "hget",
    "hset",
    "hincrby",
    "multi",
    "exec",
    "discard",
    "get",
    "set",
    "del",
    "exists",
)

#: Keys of the workers' user: every MedSplit stream and hand-off, and Celery's own keys
#: (kombu's queues ``celery*``, bindings ``_kombu*``, ``unacked*``; results
#: ``celery-task-meta-*``). Queues given other names need their patterns added.
WORKER_KEY_PATTERNS = ("medsplit:*", f"{HANDOFF_PREFIX}:*", "celery*", "_kombu*", "unacked*")

_HOSPITAL_USERNAME = re.compile(r"^hospital-([a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?)$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_SAFE_PATTERN = re.compile(r"^[A-Za-z0-9:*_.-]+$")


def handoff_rules(slug: str, *, selectors: bool = True) -> list[str]:
    """Hospital ``slug`` writes hand-offs it sends and reads those addressed to it.

    Without ``selectors`` (Redis 6 has no ``%R~``/``%W~``), both patterns are plain ``~``:
    the hospital may then also read what it sent (its own weights) and write or delete
    what is addressed to it, which only harms itself: a hand-off is sealed by its sender,
    so anything else written there is refused on opening (``medsplit.protocol.sealing``).
    """
    write, read = ("%W~", "%R~") if selectors else ("~", "~")
    return [
        f"{write}{HANDOFF_PREFIX}:to:*:from:{slug}:job:*",
        f"{read}{HANDOFF_PREFIX}:to:{slug}:from:*",
    ]


def agent_acl_rules(
    *, username: str, password_sha256: str, key_patterns: Sequence[str], selectors: bool = True
) -> list[str]:
    """The arguments of ``ACL SETUSER`` after the user name, for a hospital's agent
    (``selectors``: see :func:`handoff_rules`).

    Raises:
        ValueError: not a hospital user name, not a SHA-256, or a pattern that is not
            a plain key glob (so nothing can smuggle in another ACL rule).
    """
    match = _HOSPITAL_USERNAME.match(username)
    if match is None:
        raise ValueError(f"{username!r} is not a hospital relay user name")
    _check_digest(password_sha256)
    patterns = [_checked_pattern(p) for p in key_patterns]
    return [
        "reset",
        "on",
        f"#{password_sha256}",
        "resetchannels",
        *(f"~{p}" for p in patterns),
        *handoff_rules(match.group(1), selectors=selectors),
        "-@all",
        *(f"+{c}" for c in AGENT_COMMANDS),
    ]


def worker_acl_rules(*, password_sha256: str) -> list[str]:
    """The arguments of ``ACL SETUSER`` after the user name, for the workers (Celery).

    Every command but the ``@admin`` and ``@dangerous`` ones (no ``ACL``, ``CONFIG``,
    ``KEYS``, ``FLUSHDB``, ``CLIENT KILL``, ``DEBUG``...), on :data:`WORKER_KEY_PATTERNS`
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
        *(f"~{p}" for p in WORKER_KEY_PATTERNS),
        "+@all",
        "-@admin",
        "-@dangerous",
    ]


def _check_digest(password_sha256: str) -> None:
    if not _SHA256_HEX.match(password_sha256):
        raise ValueError("the password must be given as 64 lower-case hex digits (SHA-256)")


def _checked_pattern(pattern: str) -> str:
    if not _SAFE_PATTERN.match(pattern):
        raise ValueError(f"{pattern!r} is not a plain key pattern")
    return pattern


class RedisAclUsers:
    """The real provisioner: ACL users on the relay at ``url`` (default
    ``settings.MEDSPLIT["REDIS_URL"]``, whose credentials are the coordinator's admin
    ones and need the ``ACL`` and ``CLIENT`` commands).

    Any Redis failure (unreachable, refused, not allowed) becomes
    :class:`~hospitals.errors.RelayProvisioningFailed`, naming host and port only.
    """

    def __init__(self, url: str | None = None, *, timeout_s: float = 5.0) -> None:
        self._url = url or settings.MEDSPLIT["REDIS_URL"]
        self._timeout_s = timeout_s

    def _admin(self) -> redis.Redis:
        return redis.Redis.from_url(
            self._url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s
        )

    def _where(self, client: redis.Redis) -> str:
        kwargs = client.connection_pool.connection_kwargs
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"

    def _failed(self, client: redis.Redis, action: str, e: redis.RedisError):
        # The error's own text never holds the password; the URL is not quoted.
        return RelayProvisioningFailed(
            f"the relay at {self._where(client)} could not {action}: {type(e).__name__}: {e}"
        )

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        def rules(client: redis.Redis) -> list[str]:
            return agent_acl_rules(
                username=username,
                password_sha256=password_sha256,
                key_patterns=key_patterns,
                selectors=self._has_selectors(client),
            )

        self._setuser(username, rules)

    def provision_workers(self, *, username: str, password_sha256: str) -> None:
        """Create or replace the workers' own user (see :func:`worker_acl_rules`)."""
        self._setuser(username, lambda _: worker_acl_rules(password_sha256=password_sha256))

    def _setuser(self, username: str, rules: Callable[[redis.Redis], list[str]]) -> None:
        client = self._admin()
        try:
            client.execute_command("ACL", "SETUSER", username, *rules(client))
            self._save(client)
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

    def revoke(self, *, username: str) -> None:
        """``ACL DELUSER`` (which on Redis 7 also disconnects the user's clients), then
        ``CLIENT KILL USER`` for any connection left; a missing user is not an error."""
        client = self._admin()
        try:
            deleted = client.execute_command("ACL", "DELUSER", username)
            self._save(client)
            try:
                client.execute_command("CLIENT", "KILL", "USER", username)
            except redis.ResponseError as e:
                if "no such user" not in str(e).lower():
                    raise
        except redis.RedisError as e:
            raise self._failed(client, f"remove relay user {username}", e) from e
        finally:
            client.close()
        logger.info("relay user %s revoked (existed: %s)", username, bool(deleted))
