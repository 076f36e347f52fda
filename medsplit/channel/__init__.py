"""Channels that carry encoded frames between parties."""

from medsplit.channel.base import HANDOFF_PREFIX, Channel, StreamPair, handoff_key
from medsplit.channel.memory import InMemoryChannel
from medsplit.channel.redis import RedisChannel

__all__ = [
    "HANDOFF_PREFIX",
    "Channel",
    "InMemoryChannel",
    "RedisChannel",
    "StreamPair",
    "handoff_key",
]
