"""Attack: on a Redis Cluster, a hospital reaches another hospital's keys through a node
its user was never restricted on (a cluster does not share ACL users between nodes).

Now: ``hospitals.relay_acl.RedisAclUsers`` applies each hospital's user on every node of
the cluster. Against a real three-node cluster (``tests/redis_cluster.py``), with a job on
each node: each hospital, through the cluster client an agent uses, streams, counts and
leaves hand-offs (one ``MULTI`` each, on the job's node) on its own keys, and every
command of the agents' rules on the other hospital's keys is refused on every node.
The workers' user and relay guard see every hospital's keys on every node. Revoking and
suspending act on every node."""

from __future__ import annotations

import hashlib
import secrets
import uuid

import pytest
import redis

from hospital_agent.outbox import Left, counter_of, leave
from hospitals.relay_acl import RedisAclUsers, relay_username, workers_username
from medsplit.channel import RedisChannel, RelayKeys
from medsplit.channel.connect import connect, every_node
from tests.medsplit.test_redis_cluster import jobs_on_distinct_nodes
from tests.redis_cluster import LocalCluster
from tests.security.test_relay_keys import (
    BLOB_ATTEMPTS,
    COUNTER_ATTEMPTS,
    READS,
    STREAM_ATTEMPTS,
    _refused,
)
from workers.relay_guard import RelayGuard


def _other_keys_reached(me: redis.RedisCluster, mine: str, other: str, job: str, keys: RelayKeys):
    """Every agent command of ``mine`` on ``other``'s keys in ``job``: what got through."""
    through: dict[str, list[str]] = {}
    for topic in ("train", "agg", "infer"):
        pair = keys.streams(job, other, topic)
        for stream in (pair.up, pair.down):
            through[stream] = _refused(me, STREAM_ATTEMPTS, stream)
            through[f"{stream}:seq"] = _refused(me, COUNTER_ATTEMPTS, f"{stream}:seq")
    for topic in ("handoff", "psi"):
        to_third = keys.mail(job, sender=other, recipient="third", topic=topic)
        through[to_third] = _refused(me, BLOB_ATTEMPTS, to_third)
        to_me = keys.mail(job, sender=other, recipient=mine, topic=topic)
        through[to_me] = [a for a in _refused(me, BLOB_ATTEMPTS, to_me) if a not in READS]
    return {key: names for key, names in through.items() if names}


@pytest.mark.django_db
def test_hospital_users_hold_on_every_node(
    redis_cluster: LocalCluster,
    settings,
) -> None:
    keys = RelayKeys(f"t{uuid.uuid4().hex[:8]}")
    settings.MEDSPLIT = {**settings.MEDSPLIT, "RELAY_PREFIX": keys.prefix}
    provisioner = RedisAclUsers(redis_cluster.url())
    passwords = {slug: secrets.token_urlsafe(32) for slug in ("north", "south")}
    for slug, password in passwords.items():
        provisioner.provision(
            username=relay_username(slug, keys),
            password_sha256=hashlib.sha256(password.encode()).hexdigest(),
            slug=slug,
        )
    admin = connect(redis_cluster.url())
    clients = {
        slug: connect(redis_cluster.url(relay_username(slug, keys), password))
        for slug, password in passwords.items()
    }
    try:
        nodes = every_node(admin)
        assert len(nodes) == 3
        for node in nodes:  # the user is on each node, with the same rules
            assert node.execute_command("ACL", "GETUSER", relay_username("north", keys))
        jobs = jobs_on_distinct_nodes(admin, keys, 3)
        for slug, client in clients.items():
            other = "south" if slug == "north" else "north"
            channel = RedisChannel(redis_cluster.url(relay_username(slug, keys), passwords[slug]))
            try:
                for job in jobs:
                    # As an agent does: a frame (MULTI on the job's node) and a hand-off.
                    up = keys.streams(job, slug).up
                    channel.send(up, b"frame-" + job.encode())
                    key = keys.mail(job, sender=slug, recipient=other)
                    leave(client, Left(key=key, blob=b"sealed", counter=counter_of(up)), ttl=60)
                    assert admin.get(key) == b"sealed"
            finally:
                channel.close()
        for job in jobs:
            for me, other in (("north", "south"), ("south", "north")):
                through = _other_keys_reached(clients[me], me, other, job, keys)
                assert not through, f"{me} reached keys of {other} in {job}: {through}"
            # Its own streams are its own on this node too.
            assert clients["south"].xlen(keys.streams(job, "south").up) == 1
        # The workers' user reaches every hospital's keys on every node; their relay guard
        # finds each hospital's keys of all three jobs (SCAN visits every primary).
        workers_password = secrets.token_urlsafe(32)
        provisioner.provision_workers(
            username=workers_username(keys),
            password_sha256=hashlib.sha256(workers_password.encode()).hexdigest(),
        )
        workers = connect(redis_cluster.url(workers_username(keys), workers_password))
        try:
            guard = RelayGuard(workers, keys, lambda job, hospital: None)
            for slug in passwords:
                assert len(guard.usage(slug)) == 3 * 3  # per job: stream, counters, hand-off
        finally:
            workers.close()
        provisioner.revoke(username=relay_username("north", keys))
        for node in nodes:
            assert node.execute_command("ACL", "GETUSER", relay_username("north", keys)) is None
            assert node.execute_command("ACL", "GETUSER", relay_username("south", keys))
        # Suspending switches the user off on every node and deletes what it stored on each.
        deleted = provisioner.suspend(username=relay_username("south", keys), slug="south")
        assert deleted == 3 * 3  # per job: its up stream, the stream's counters, a hand-off
        assert not list(admin.scan_iter(match=keys.hospital_streams_pattern("south")))
        for node in nodes:
            user = node.acl_getuser(relay_username("south", keys))
            assert user["enabled"] is False, node
    finally:
        for client in clients.values():
            client.close()
        for username in [
            *(relay_username(slug, keys) for slug in passwords),
            workers_username(keys),
        ]:
            provisioner.revoke(username=username)
        for key in admin.scan_iter(match=keys.deployment_pattern()):
            admin.delete(key)
        admin.close()
