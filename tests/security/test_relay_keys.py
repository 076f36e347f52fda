"""Attack: a hospital reaches another hospital's keys on the relay.

Before: a hospital's rule was one glob, ``~medsplit:*:<slug>:*``, so a hospital whose slug
was ``up`` or ``down`` could HGET, HSET, HINCRBY and DEL every other hospital's stream
counters (``medsplit:job-N:<other>:up:seq``) and break their turns.

Now: the key layout of ``medsplit.channel.keys`` and the rules of
``hospitals.relay_acl``. A property test draws pairs of distinct slugs, reserved-looking
words included, provisions both on a real relay started by ``deploy/redis-start.sh``, and
tries, as each, every command of the agents' rules on every key family of the other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hospitals.relay_acl import relay_username
from medsplit.channel import RedisChannel
from medsplit.channel.keys import NAME_PATTERN, RESERVED_WORDS, RelayKeys
from tests.security.relay import DeployedRelay, deployed_relay  # noqa: F401 - fixture

JOB = "job-7"
#: Words that look like parts of a key, and names that are prefixes of one another.
TRICKY = [*sorted(RESERVED_WORDS), "a", "ab", "a-b", "to-from", "up-seq", "x", "hospital-1"]
slugs = st.one_of(st.sampled_from(TRICKY), st.from_regex(f"^{NAME_PATTERN}$", fullmatch=True))

#: What a command does to a key: read, write or delete; the command family an agent has.
Attempt = Callable[[redis.Redis, str], object]
STREAM_ATTEMPTS: dict[str, Attempt] = {
    "XADD": lambda c, k: c.xadd(k, {"d": b"junk"}),
    "XREAD": lambda c, k: c.xread({k: "0"}),
    "XRANGE": lambda c, k: c.xrange(k),
    "XLEN": lambda c, k: c.xlen(k),
    "XDEL": lambda c, k: c.xdel(k, "0-1"),
    "XTRIM": lambda c, k: c.xtrim(k, maxlen=0),
    # How a reader takes frames (medsplit.channel.redis): another's group is out of reach.
    "XGROUP CREATE": lambda c, k: c.xgroup_create(k, "medsplit", id="0", mkstream=True),
    "XREADGROUP": lambda c, k: c.xreadgroup("medsplit", "reader", {k: ">"}),
    "XACK": lambda c, k: c.xack(k, "medsplit", "0-1"),
    "XPENDING": lambda c, k: c.xpending(k, "medsplit"),
}
COUNTER_ATTEMPTS: dict[str, Attempt] = {
    "HGET": lambda c, k: c.hget(k, "sent"),
    "HSET": lambda c, k: c.hset(k, "sent", 99),
    "HINCRBY": lambda c, k: c.hincrby(k, "sent", 1),
    "DEL": lambda c, k: c.delete(k),
}
BLOB_ATTEMPTS: dict[str, Attempt] = {
    "GET": lambda c, k: c.get(k),
    "EXISTS": lambda c, k: c.exists(k),
    "SET": lambda c, k: c.set(k, b"forged"),
    "DEL": lambda c, k: c.delete(k),
}
READS = {"GET", "EXISTS"}


def _refused(client: redis.Redis, attempts: dict[str, Attempt], key: str) -> list[str]:
    """The attempts on ``key`` that the relay let through (should be none)."""
    allowed = []
    for name, attempt in attempts.items():
        try:
            attempt(client, key)
        except redis.exceptions.NoPermissionError:
            continue
        allowed.append(name)
    return allowed


def _attempts_on_the_other(
    me: redis.Redis, mine: str, other: str, third: str, keys: RelayKeys
) -> dict[str, list[str]]:
    """Every command ``mine`` could use, on every key of ``other``'s: what got through."""
    through: dict[str, list[str]] = {}
    for topic in ("train", "agg", "infer"):
        pair = keys.streams(JOB, other, topic)
        for stream in (pair.up, pair.down):
            through[stream] = _refused(me, STREAM_ATTEMPTS, stream)
            through[f"{stream}:seq"] = _refused(me, COUNTER_ATTEMPTS, f"{stream}:seq")
            through[f"{stream} (as a hash)"] = _refused(me, COUNTER_ATTEMPTS, stream)
    for topic in ("handoff", "psi", "mask-seed"):
        # Between the other and a third hospital: out of reach both ways.
        for sender, recipient in ((other, third), (third, other)):
            key = keys.mail(JOB, sender=sender, recipient=recipient, topic=topic)
            through[key] = _refused(me, BLOB_ATTEMPTS, key)
        # Addressed to me by the other: readable, not writable nor removable.
        to_me = keys.mail(JOB, sender=other, recipient=mine, topic=topic)
        through[to_me] = [a for a in _refused(me, BLOB_ATTEMPTS, to_me) if a not in READS]
        # Sent by me to the other: writable and removable, not readable.
        from_me = keys.mail(JOB, sender=mine, recipient=other, topic=topic)
        through[from_me] = [a for a in _refused(me, BLOB_ATTEMPTS, from_me) if a in READS]
    return {key: names for key, names in through.items() if names}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pair=st.tuples(slugs, slugs).filter(lambda p: p[0] != p[1]))
def test_no_hospital_reaches_a_key_of_another(
    deployed_relay: DeployedRelay,  # noqa: F811 - the fixture
    pair: tuple[str, str],
) -> None:
    a, b = pair
    third = next(s for s in ("c", "c2", "c3") if s not in pair)
    keys = RelayKeys(f"t{uuid.uuid4().hex[:8]}")
    admin = deployed_relay.admin()
    clients = {a: deployed_relay.hospital(a, keys), b: deployed_relay.hospital(b, keys)}
    try:
        # Each hospital uses its own keys as an agent does, so that every key exists.
        for slug, client in clients.items():
            pair_ = keys.streams(JOB, slug)
            client.xadd(pair_.up, {"d": b"frame"})
            client.hincrby(f"{pair_.up}:seq", "sent", 1)
            other = b if slug == a else a
            client.set(keys.mail(JOB, sender=slug, recipient=other), b"sealed")
        for me, other in ((a, b), (b, a)):
            through = _attempts_on_the_other(clients[me], me, other, third, keys)
            assert not through, f"hospital {me!r} reached keys of {other!r}: {through}"
    finally:
        for client in clients.values():
            client.close()
        for slug in pair:
            admin.execute_command("ACL", "DELUSER", relay_username(slug, keys))
        for key in admin.scan_iter(match=keys.deployment_pattern()):
            admin.delete(key)
        admin.close()


def test_a_hospital_still_uses_its_own_keys_and_nothing_else(
    deployed_relay: DeployedRelay,  # noqa: F811 - the fixture
) -> None:
    """The other side of the property: the rules are not simply "nothing"."""
    keys = RelayKeys(f"t{uuid.uuid4().hex[:8]}")
    me = deployed_relay.hospital("north", keys)
    other = deployed_relay.hospital("south", keys)
    try:
        own = keys.streams(JOB, "north")
        me.xadd(own.up, {"d": b"frame"})
        assert me.xlen(own.up) == 1 and me.hincrby(f"{own.up}:seq", "sent", 1) == 1
        # Its channel takes frames from its own down stream through the stream's group.
        login = me.connection_pool.connection_kwargs
        mine = RedisChannel(deployed_relay.url_for(login["username"], login["password"]))
        workers = RedisChannel(deployed_relay.admin_url)
        for frame in (b"gradients", b"more"):
            workers.send(own.down, frame)
        assert [mine.receive(own.down, timeout=5) for _ in range(2)] == [b"gradients", b"more"]
        mine.close()
        workers.close()
        assert me.xlen(own.down) == 0
        blob = keys.mail(JOB, sender="north", recipient="south")
        assert me.set(blob, b"sealed") and other.get(blob) == b"sealed"
        assert me.delete(blob) == 1
        # Nothing but streams and counters under its own prefix: no junk strings or hashes.
        for junk in (keys.hospital_prefix("north") + "junk", own.up + ":junk"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                me.set(junk, b"x" * 1024)
        with pytest.raises(redis.exceptions.NoPermissionError):
            me.hset(keys.hospital_prefix("north") + "junk", "f", b"x")
    finally:
        me.close()
        other.close()
        admin = deployed_relay.admin()
        for slug in ("north", "south"):
            admin.execute_command("ACL", "DELUSER", relay_username(slug, keys))
        for key in admin.scan_iter(match=keys.deployment_pattern()):
            admin.delete(key)
        admin.close()


@pytest.mark.django_db
@pytest.mark.parametrize("word", sorted(RESERVED_WORDS))
def test_every_word_of_the_layout_is_refused_as_a_slug(word: str) -> None:
    from hospitals import services
    from kernel.actors import Actor
    from kernel.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        services.hospital_register(actor=Actor.system(), name=f"Hospital {word}", slug=word)
    assert "reserved" in str(refused.value.details)
