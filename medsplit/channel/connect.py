"""Connecting to the relay: one Redis, or a Redis Cluster.

A relay URL says which: ``redis://`` / ``rediss://`` / ``unix://`` is one Redis, as
always; ``redis+cluster://host:port`` / ``rediss+cluster://host:port`` is a Redis Cluster
reached through any of its nodes (redis-py's :class:`redis.cluster.RedisCluster`, which
learns the others with ``CLUSTER SLOTS``). A cluster has one database, so its URL names
none or ``/0``.

On a cluster every key of one job shares one hash tag (``{job-7}``, see
:mod:`medsplit.channel.keys`), so the commands of one step (a stream, its counters, a
hand-off and its mark, each sent in one ``MULTI``) run on one node. :func:`node_client`
gives the plain client of the node that holds a key, for the transactions the channel
writes by hand; :func:`every_node` gives one client per node, for what each node keeps
for itself (ACL users, which a cluster does not share between nodes).

Celery's broker is never a cluster: kombu's Redis transport has no cluster support.
"""

from __future__ import annotations

import re
from typing import Any

import redis
from redis.cluster import RedisCluster

from medsplit.errors import ConfigError

#: Cluster schemes and the plain scheme redis-py reads for each.
CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}
#: Every scheme a relay URL may have.
RELAY_SCHEMES = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)

_TAG = re.compile(r"\{([^}]+)\}")

RelayClient = redis.Redis | RedisCluster


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return isinstance(url, str) and url.startswith(tuple(CLUSTER_SCHEMES))


def plain_url(url: str) -> str:
    """``url`` with a cluster scheme written the way redis-py reads it (``redis://``)."""
    for cluster, plain in CLUSTER_SCHEMES.items():
        if url.startswith(cluster):
            return plain + url[len(cluster) :]
    return url


def connect(url: str, **options: Any) -> RelayClient:
    """A client of the relay at ``url``: :class:`redis.Redis` for one Redis,
    :class:`~redis.cluster.RedisCluster` for a cluster URL. ``options`` are redis-py's
    (``retry`` included: on a cluster it is the cluster client's own).

    Raises:
        ConfigError: a cluster URL that names a database other than 0 or a socket.
        redis.RedisError: a cluster none of whose named nodes answered ``CLUSTER SLOTS``
            (a cluster client learns the cluster as it is made).
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    plain = plain_url(url)
    db = plain.split("?", 1)[0].split("/", 3)[3:]
    if db and db[0] not in ("", "0"):
        raise ConfigError(
            f"a Redis Cluster has only database 0; the relay URL names /{db[0]}: drop it"
        )
    try:
        return RedisCluster.from_url(plain, **options)
    except redis.exceptions.RedisClusterException as e:
        raise redis.ConnectionError(f"the Redis Cluster at the relay URL: {e}") from e


def hash_tag(key: str) -> str | None:
    """The part of ``key`` a cluster hashes when it has one: the first ``{...}`` with
    something inside."""
    match = _TAG.search(key)
    return match.group(1) if match else None


def node_client(client: RelayClient, key: str) -> redis.Redis:
    """The plain client of the node that holds ``key``'s slot (``client`` itself for one
    Redis). A transaction on it must name only keys of ``key``'s slot: on a cluster,
    ``key`` must carry a hash tag, which the keys beside it share.

    Raises:
        ConfigError: ``key`` has no hash tag and ``client`` is a cluster.
    """
    if not isinstance(client, RedisCluster):
        return client
    if hash_tag(key) is None:
        raise ConfigError(
            f"key {key!r} has no hash tag ({{...}}): on a Redis Cluster its counters would "
            "hash to another node; name streams with RelayKeys, which tags every job's keys"
        )
    node = client.get_node_from_key(key)
    if node.redis_connection is None:  # a node the client has not connected to yet
        client.nodes_manager.initialize()
        node = client.get_node_from_key(key)
    return node.redis_connection


def every_node(client: RelayClient) -> list[redis.Redis]:
    """One plain client per node, primaries and replicas (``[client]`` for one Redis):
    what a node keeps for itself (ACL users) must be applied to each."""
    if not isinstance(client, RedisCluster):
        return [client]
    return [client.get_redis_connection(node) for node in client.get_nodes()]


def forget_slots(client: RelayClient) -> None:
    """Make a cluster client learn its slots again at its next command (after a
    ``MOVED``: the cluster was resharded); nothing for one Redis."""
    if isinstance(client, RedisCluster):
        client.nodes_manager.initialize()
