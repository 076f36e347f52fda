"""Channels that carry encoded frames between parties."""

from medsplit.channel.base import Channel, StreamPair
from medsplit.channel.memory import InMemoryChannel

__all__ = ["Channel", "InMemoryChannel", "StreamPair"]
