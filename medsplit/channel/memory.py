"""A channel inside one process, for simulations and tests."""

from __future__ import annotations

import threading
from collections import defaultdict, deque

from medsplit.channel.base import Channel
from medsplit.errors import ChannelError, ChannelTimeout


class InMemoryChannel(Channel):
    """Streams as in-process queues; safe to share between threads.

    Args:
        max_pending: most payloads a stream may hold before ``send`` refuses more, so a
            consumer that stopped reading shows up as an error rather than as memory growth.
    """

    def __init__(self, *, max_pending: int = 1024) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._max_pending = max_pending
        self._streams: defaultdict[str, deque[bytes]] = defaultdict(deque)
        self._ready = threading.Condition()
        self.bytes_sent: defaultdict[str, int] = defaultdict(int)

    def send(self, stream: str, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            kind = type(payload).__name__
            raise ChannelError(f"payload for {stream!r} must be bytes, got {kind}")
        with self._ready:
            queue = self._streams[stream]
            if len(queue) >= self._max_pending:
                raise ChannelError(
                    f"stream {stream!r} already holds {len(queue)} unread frames; "
                    "is its reader running?"
                )
            queue.append(bytes(payload))
            self.bytes_sent[stream] += len(payload)
            self._ready.notify_all()

    def receive(self, stream: str, *, timeout: float) -> bytes:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._streams[stream]), timeout=timeout):
                raise ChannelTimeout(f"no frame on stream {stream!r} within {timeout:g} s")
            return self._streams[stream].popleft()

    def reset(self, stream: str) -> None:
        with self._ready:
            self._streams.pop(stream, None)

    def pending(self, stream: str) -> int:
        """Payloads waiting on ``stream``."""
        with self._ready:
            return len(self._streams[stream])
