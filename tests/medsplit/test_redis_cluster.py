"""The relay on a real three-node Redis Cluster (``tests/redis_cluster.py``): every key of
one job carries the job's hash tag, so the channel's transactions (a frame's chunks and its
counter, a read and its commit) run on the node of that tag, and a job's training steps
over the cluster give the weights of the same steps done with no channel, bit for bit."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.cluster import RedisCluster

from medsplit.channel import RedisChannel, RelayKeys
from medsplit.channel.connect import connect, hash_tag, is_cluster_url, node_client, plain_url
from medsplit.errors import ChannelError, ConfigError
from medsplit.turns.multi import StepPolicy
from tests.medsplit.test_multi_stream import Setup, check_exact, serve
from tests.redis_cluster import LocalCluster


def jobs_on_distinct_nodes(client: RedisCluster, keys: RelayKeys, count: int) -> list[str]:
    """``count`` job names whose hash tags fall on ``count`` different nodes."""
    found: dict[str, str] = {}
    base = uuid.uuid4().hex[:8]
    for n in range(1000):
        job = f"job-{base}{n}"
        node = client.get_node_from_key(keys.streams(job, "h0").up).name
        found.setdefault(node, job)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("the cluster's slots are not spread over its nodes")


def test_every_key_of_a_job_carries_its_hash_tag() -> None:
    keys = RelayKeys("t")
    job = "job-7"
    named = [
        *(
            getattr(keys.streams(job, "h1", topic), end)
            for topic in ("train", "agg", "infer")
            for end in ("up", "down")
        ),
        keys.streams(job, "h1").up + ":seq",
        *(keys.mail(job, sender="h1", recipient="h2", topic=t) for t in ("handoff", "psi")),
    ]
    assert {hash_tag(k) for k in named} == {job}


def test_cluster_urls_are_told_apart() -> None:
    assert is_cluster_url("redis+cluster://h:1/0") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1/0")
    assert plain_url("rediss+cluster://u:p@h:1/0") == "rediss://u:p@h:1/0"
    with pytest.raises(ConfigError, match="only database 0"):
        connect("redis+cluster://127.0.0.1:1/3")
    single = connect("redis://127.0.0.1:1/0")  # one Redis: the plain client, as before
    assert type(single) is redis.Redis


def test_a_job_over_the_cluster_equals_the_same_steps_in_sequence(
    redis_cluster: LocalCluster,
) -> None:
    keys = RelayKeys(f"t{uuid.uuid4().hex[:8]}")
    channels = [RedisChannel(redis_cluster.url()) for _ in range(3)]
    try:
        cluster = channels[0]._redis
        assert isinstance(cluster, RedisCluster)
        # Two jobs on two different nodes, each served whole on its own node.
        for job in jobs_on_distinct_nodes(cluster, keys, 2):
            setup = Setup("ushaped")

            def pair_of(position: int, job: str = job):
                return keys.streams(job, f"h{position}")

            served = serve(setup, list(channels), StepPolicy.ALL, "", pair_of=pair_of)
            check_exact(setup, served)
            node = node_client(cluster, pair_of(0).up)
            # The counters sit beside their streams, on the job's node.
            assert int(node.hget(pair_of(0).up + ":seq", "read")) > 0
            for position in range(2):
                for stream in (pair_of(position).up, pair_of(position).down):
                    channels[0].reset(stream)
        with pytest.raises(ConfigError, match="no hash tag"):
            channels[0].send("untagged-stream", b"x")
    finally:
        for channel in channels:
            channel.close()


def test_a_cluster_is_refused_as_celerys_broker(tmp_path) -> None:
    from tests.security.test_passwords import _manage

    refused = _manage(
        {
            "MEDSPLIT_WORKER_REDIS_URL": "redis+cluster://127.0.0.1:7000",
            "CELERY_BROKER_URL": "",
        },
        tmp_path,
    )
    assert refused.returncode != 0
    assert "Celery's broker cannot be a Redis Cluster" in refused.stderr


def test_a_moved_slot_fails_one_send_and_the_next_goes_to_its_new_node(
    redis_cluster: LocalCluster,
) -> None:
    keys = RelayKeys(f"t{uuid.uuid4().hex[:8]}")
    channel = RedisChannel(redis_cluster.url())
    admin = connect(redis_cluster.url())
    try:
        stream = keys.streams(f"job-{uuid.uuid4().hex[:8]}", "h0").up
        slot = admin.keyslot(stream)
        owner = admin.get_node_from_key(stream)
        other = next(n for n in admin.get_primaries() if n.name != owner.name)
        ids = {n.name: admin.cluster_myid(n) for n in admin.get_primaries()}

        def give_slot_to(name: str) -> None:  # the slot is empty, so no keys move
            for node in admin.get_primaries():
                node.redis_connection.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[name])

        give_slot_to(other.name)
        try:
            with pytest.raises(ChannelError, match="the cluster moved the stream's slot"):
                channel.send(stream, b"frame")
            channel.send(stream, b"frame")  # the channel learnt the slot's new node
            assert channel.receive(stream, timeout=5) == b"frame"
            assert other.redis_connection.exists(stream) == 1
            channel.reset(stream)
        finally:
            give_slot_to(owner.name)
    finally:
        channel.close()
        admin.close()
