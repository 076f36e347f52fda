"""Channels that carry encoded frames between parties."""

from medsplit.channel.base import Channel, StreamPair
from medsplit.channel.memory import InMemoryChannel
from medsplit.channel.redis import RedisChannel

__all__ = ["Channel", "InMemoryChannel", "RedisChannel", "StreamPair"]
