"""The in-memory channel: ordered, bounded, with timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from medsplit.channel import InMemoryChannel
from medsplit.errors import ChannelError, ChannelTimeout
from tests.redis_server import session_keys


def test_streams_are_ordered_and_separate() -> None:
    channel = InMemoryChannel()
    for i in range(3):
        channel.send("a", bytes([i]))
    channel.send("b", b"other")
    assert [channel.receive("a", timeout=0.1) for _ in range(3)] == [b"\x00", b"\x01", b"\x02"]
    assert channel.receive("b", timeout=0.1) == b"other"
    assert channel.bytes_sent["a"] == 3


def test_receive_times_out_with_the_stream_named() -> None:
    channel = InMemoryChannel()
    start = time.monotonic()
    with pytest.raises(ChannelTimeout, match="'empty'"):
        channel.receive("empty", timeout=0.05)
    assert time.monotonic() - start < 5


def test_receive_wakes_when_another_thread_sends() -> None:
    channel = InMemoryChannel()
    threading.Timer(0.05, channel.send, args=("s", b"late")).start()
    assert channel.receive("s", timeout=10) == b"late"


def test_a_full_stream_refuses_more() -> None:
    channel = InMemoryChannel(max_pending=2)
    channel.send("s", b"1")
    channel.send("s", b"2")
    with pytest.raises(ChannelError, match="2 unread frames"):
        channel.send("s", b"3")
    assert channel.pending("s") == 2


def test_only_bytes_are_sent() -> None:
    with pytest.raises(ChannelError, match="must be bytes"):
        InMemoryChannel().send("s", "text")  # type: ignore[arg-type]


def test_stream_names_are_per_job_and_hospital() -> None:
    a = session_keys().streams("job", "h1")
    b = session_keys().streams("job", "h2")
    assert len({a.up, a.down, b.up, b.down}) == 4
