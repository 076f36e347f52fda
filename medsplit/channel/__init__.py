"""Channels that carry encoded frames between parties."""

from medsplit.channel.base import Channel
from medsplit.channel.keys import RelayKeys, StreamPair
from medsplit.channel.memory import InMemoryChannel
from medsplit.channel.redis import RedisChannel

__all__ = [
    "Channel",
    "InMemoryChannel",
    "RedisChannel",
    "RelayKeys",
    "StreamPair",
]
