"""The Redis channel, against a real Redis: round trips, chunking, losses found, errors."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import torch
from torch import nn

from medsplit.channel import InMemoryChannel, RedisChannel
from medsplit.channel.base import Channel
from medsplit.channel.redis import _pack
from medsplit.cutting import split_model
from medsplit.errors import ChannelError, ChannelTimeout
from medsplit.modes import get_mode
from medsplit.protocol.link import LocalLink
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import StepIds
from tests.redis_server import session_keys

CHUNK = 1024


@pytest.fixture
def stream(redis_url: str) -> Iterator[str]:
    """A stream name no other test uses; its keys are removed afterwards."""
    name = f"medsplit-test-{uuid.uuid4()}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(*client.keys(f"*{name}*") or [name])
    client.close()


@pytest.fixture
def channel(redis_url: str) -> Iterator[RedisChannel]:
    ch = RedisChannel(redis_url, chunk_bytes=CHUNK)
    yield ch
    ch.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def payload(size: int, seed: int = 0) -> bytes:
    return (
        torch.randint(0, 256, (size,), generator=torch.Generator().manual_seed(seed))
        .to(torch.uint8)
        .numpy()
        .tobytes()
    )


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_payloads_of_every_size_round_trip(channel: RedisChannel, stream: str, size: int) -> None:
    data = payload(size, seed=size)
    channel.send(stream, data)
    assert channel.receive(stream, timeout=2) == data
    assert channel.bytes_sent[stream] == size


def test_order_is_kept_and_consumed_entries_are_deleted(
    channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    sent = [payload(i * 300, seed=i) for i in range(40)]
    for data in sent:
        channel.send(stream, data)
    assert [channel.receive(stream, timeout=2) for _ in sent] == sent
    # The chunks of the message taken last stay until the next read.
    assert raw.xlen(stream) == -(-len(sent[-1]) // CHUNK)
    with pytest.raises(ChannelTimeout):
        channel.receive(stream, timeout=0)
    assert raw.xlen(stream) == 0


def test_streams_are_independent(channel: RedisChannel, stream: str) -> None:
    other = stream + ":other"
    channel.send(stream, b"a1")
    channel.send(other, b"b1")
    channel.send(stream, b"a2")
    assert channel.receive(other, timeout=2) == b"b1"
    assert channel.receive(stream, timeout=2) == b"a1"
    assert channel.receive(stream, timeout=2) == b"a2"
    with pytest.raises(ChannelTimeout):
        channel.receive(other, timeout=0.05)


def test_a_new_reader_continues_where_the_last_one_stopped(
    redis_url: str, channel: RedisChannel, stream: str
) -> None:
    for i in range(3):
        channel.send(stream, bytes([i]))
    assert channel.receive(stream, timeout=2) == b"\x00"
    channel.close()
    reader = RedisChannel(redis_url)
    assert [reader.receive(stream, timeout=2) for _ in range(2)] == [b"\x01", b"\x02"]
    reader.close()


def test_receive_times_out_with_the_stream_named(channel: RedisChannel, stream: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChannelTimeout, match=stream):
        channel.receive(stream, timeout=0.2)
    assert 0.15 < time.monotonic() - start < 1.5


def test_receive_wakes_when_another_thread_sends(
    redis_url: str, channel: RedisChannel, stream: str
) -> None:
    sender = RedisChannel(redis_url)
    timer = threading.Timer(0.1, sender.send, args=(stream, b"late"))
    timer.start()
    assert channel.receive(stream, timeout=5) == b"late"
    # The frame arrives before the sender has read its transaction's reply: closing its
    # connection under it would fail the sending thread.
    timer.join(5)
    sender.close()


def test_frames_trimmed_before_they_were_read_are_an_error(
    redis_url: str, stream: str, raw: redis.Redis
) -> None:
    channel = RedisChannel(redis_url, max_stream_len=10)
    for i in range(300):  # approximate trimming drops whole nodes of 100 entries
        channel.send(stream, b"%d" % i)
    with pytest.raises(ChannelError, match="trimmed before they were read"):
        channel.receive(stream, timeout=1)
    # Still there: the frame after the gap (taken, held for the next receive) and the rest.
    rest = [channel.receive(stream, timeout=1) for _ in range(raw.xlen(stream))]
    assert rest[-1] == b"299"
    assert [int(r) for r in rest] == list(range(300 - len(rest), 300))
    channel.close()


def test_a_payload_needing_more_chunks_than_the_stream_keeps_is_refused(
    redis_url: str, stream: str
) -> None:
    channel = RedisChannel(redis_url, chunk_bytes=4, max_stream_len=2)
    with pytest.raises(ChannelError, match="3 chunks"):
        channel.send(stream, b"123456789")
    channel.close()


def entry(s: int, m: int, i: int, n: int, d: bytes = b"x") -> dict[str, object]:
    return {"s": s, "m": m, "i": i, "n": n, "d": d}


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([entry(1, 1, 0, 2)], "missing chunks: 1 of 2"),
        ([entry(1, 1, 0, 3), entry(2, 1, 2, 3), entry(3, 1, 1, 3)], "chunk 2/3 .* chunk 1/3"),
        ([entry(1, 1, 0, 2), entry(2, 2, 0, 1)], "unfinished .*1 of 2.* message 2 begins"),
        ([entry(1, 1, 1, 2)], "chunk 0 is missing"),
        ([{"s": 1, "d": b"x"}], r"fields \['m', 'i', 'n'\] missing"),
        ([entry(1, 1, 0, 1) | {"i": b"zero"}], "garbled"),
        ([entry(1, 1, 5, 2)], "garbled"),
        ([entry(1, 1, 0, 1) | {"s": b"one"}], "garbled"),
    ],
)
def test_missing_misplaced_or_garbled_chunks_are_an_error(
    channel: RedisChannel,
    stream: str,
    raw: redis.Redis,
    entries: list[dict[str, object]],
    error: str,
) -> None:
    for fields in entries:
        raw.xadd(stream, fields)  # type: ignore[arg-type]
    raw.hset(stream + ":seq", "sent", len(entries))
    start = time.monotonic()
    with pytest.raises(ChannelError, match=error):
        channel.receive(stream, timeout=5)
    assert time.monotonic() - start < 1


def test_rediss_urls_use_tls() -> None:
    channel = RedisChannel("rediss://user:secret@redis.example:6380/2")
    pool = channel._redis.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)
    assert pool.connection_kwargs["db"] == 2
    assert channel.address == "redis.example:6380"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"chunk_bytes": 0}, "chunk_bytes"), ({"max_stream_len": 0}, "max_stream_len")],
)
def test_bad_arguments_are_named(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RedisChannel("redis://127.0.0.1:6379/0", **kwargs)
    with pytest.raises(ValueError, match="url"):
        RedisChannel("http://127.0.0.1:6379/0")


def test_an_unreachable_redis_is_a_channel_error_naming_host_and_port() -> None:
    channel = RedisChannel("redis://user:secret@127.0.0.1:1/0", connect_timeout=1)
    start = time.monotonic()
    with pytest.raises(ChannelError, match=r"at 127\.0\.0\.1:1 failed") as sent:
        channel.send("s", b"x")
    with pytest.raises(ChannelError, match=r"at 127\.0\.0\.1:1 failed") as received:
        channel.receive("s", timeout=0.1)
    assert time.monotonic() - start < 3
    for error in (sent.value, received.value):
        assert "secret" not in str(error)
        assert isinstance(error.__cause__, redis.ConnectionError)


def test_a_redis_that_never_answers_is_an_error_not_a_hang() -> None:
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        channel = RedisChannel(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
        start = time.monotonic()
        with pytest.raises(ChannelError, match=f"127\\.0\\.0\\.1:{port}"):
            channel.receive("s", timeout=0.2)
        with pytest.raises(ChannelError, match="Timeout"):
            channel.send("s", b"x")
        assert time.monotonic() - start < 3
        channel.close()


def test_frames_taken_by_another_reader_are_reported(
    redis_url: str, channel: RedisChannel, stream: str
) -> None:
    for i in range(3):
        channel.send(stream, bytes([i]))
    assert channel.receive(stream, timeout=2) == b"\x00"
    other = RedisChannel(redis_url)
    assert other.receive(stream, timeout=2) == b"\x01"
    other.close()
    with pytest.raises(ChannelError, match=r"entries 2\.\.2 .* another reader"):
        channel.receive(stream, timeout=2)
    assert channel.receive(stream, timeout=2) == b"\x02"


def one_step(channel: Channel, job: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    split = split_model(model, torch.zeros(2, 16), "2")
    config = OptimizerConfig(name="sgd", lr=0.1)
    front = Party.create(split.front, config)
    back = Party.create(split.tail, config)
    client = get_mode("vanilla").client_role({"front": front}, split)
    server = get_mode("vanilla").server_role(back, split, job="job-1")
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(4, 16, generator=gen), torch.randint(0, 2, (4,), generator=gen)
    LocalLink(channel, session_keys().streams(job, "h1"), timeout=5).run_step(
        client, server, StepIds("job-1", 0, 0, 0), x, y
    )
    return {
        **{f"front.{k}": v for k, v in split.front.state_dict().items()},
        **{f"back.{k}": v for k, v in split.tail.state_dict().items()},
    }


def test_a_split_step_over_redis_matches_the_in_memory_one(redis_url: str, stream: str) -> None:
    over_redis = RedisChannel(redis_url, chunk_bytes=64)  # several chunks per frame
    expected = one_step(InMemoryChannel(), stream)
    got = one_step(over_redis, stream)
    over_redis.close()
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_restarted_sender_continues_the_numbering(
    redis_url: str, channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    first = RedisChannel(redis_url)
    first.send(stream, b"a")
    first.send(stream, b"bb")
    first.close()
    restarted = RedisChannel(redis_url)
    restarted.send(stream, b"c")
    restarted.send(stream, b"d" * (3 * CHUNK))  # the reader's chunks: 4 entries
    restarted.close()
    assert [channel.receive(stream, timeout=2) for _ in range(3)] == [b"a", b"bb", b"c"]
    assert channel.receive(stream, timeout=2) == b"d" * (3 * CHUNK)
    channel.close()  # deletes and records the message taken last
    assert raw.hget(stream + ":seq", "sent") == b"4"  # the sender's default chunks: 1 each
    assert raw.hget(stream + ":seq", "read") == b"4"
    assert raw.xlen(stream) == 0


def test_numbers_taken_by_a_sender_that_died_before_appending_are_a_reported_gap(
    redis_url: str, channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    channel.send(stream, b"before")
    raw.hincrby(stream + ":seq", "sent", 2)  # numbered, never appended
    restarted = RedisChannel(redis_url)
    restarted.send(stream, b"after")
    restarted.close()
    assert channel.receive(stream, timeout=2) == b"before"
    with pytest.raises(ChannelError, match=r"entries 2\.\.3 are gone"):
        channel.receive(stream, timeout=2)
    assert channel.receive(stream, timeout=2) == b"after"


def test_a_sender_put_out_of_step_says_so_and_the_reader_reports_it(
    redis_url: str, channel: RedisChannel, stream: str
) -> None:
    channel.send(stream, b"a1")
    other = RedisChannel(redis_url)
    other.send(stream, b"b1")  # a second sender, taking turns: against the rule
    other.close()
    with pytest.raises(ChannelError, match=r"counter reached 3 where this sender expected 2"):
        channel.send(stream, b"a2")  # numbered from its stale count: entry 2 again
    channel.send(stream, b"a3")  # continues from the counter: entry 4
    reader = RedisChannel(redis_url)
    assert reader.receive(stream, timeout=2) == b"a1"
    assert reader.receive(stream, timeout=2) == b"b1"
    with pytest.raises(ChannelError, match="out of order"):
        reader.receive(stream, timeout=2)
    assert reader.receive(stream, timeout=2) == b"a2"  # reported, not thrown away
    with pytest.raises(ChannelError, match=r"entries 3\.\.3 are gone"):
        reader.receive(stream, timeout=2)
    assert reader.receive(stream, timeout=2) == b"a3"
    reader.close()


def test_a_sender_whose_relay_lost_its_data_goes_on_and_the_reader_reports_what_was_lost(
    channel: RedisChannel, stream: str, raw: redis.Redis, redis_url: str
) -> None:
    """A relay restarted without its data, under parties that were busy computing:
    redis-py reconnects them without a word, their counts and places are stale. The sender
    moves the counter up to its count and the reader keeps its place, so the numbering
    shows what the restart took: nothing the first time, a frame in flight the second."""
    sender = RedisChannel(redis_url)
    for frame in (b"a", b"b"):
        sender.send(stream, frame)
        assert channel.receive(stream, timeout=2) == frame
    raw.delete(stream, stream + ":seq")  # what a restart keeps of them: nothing
    sender.send(stream, b"c")  # no error: the counter is moved up to the sender's count
    sender.send(stream, b"d")
    assert raw.hget(stream + ":seq", "sent") == b"4"
    assert [channel.receive(stream, timeout=2) for _ in range(2)] == [b"c", b"d"]
    sender.send(stream, b"e")
    raw.delete(stream, stream + ":seq")  # e was on the relay, not yet read
    sender.send(stream, b"f")
    sender.close()
    with pytest.raises(ChannelError, match=r"entries 5\.\.5 are gone"):
        channel.receive(stream, timeout=2)
    assert channel.receive(stream, timeout=2) == b"f"


def test_a_new_frame_under_an_old_entry_id_is_not_deleted_with_the_old_one(
    channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    """A reader deletes the message it took with its next read. If the stream was made
    afresh in between (a reset, a relay restarted) within the same millisecond, a new
    entry can carry the old one's id: it must be delivered, not deleted in its place."""
    channel.send(stream, b"old")
    assert channel.receive(stream, timeout=2) == b"old"
    (old_id,) = [entry_id for entry_id, _ in raw.xrange(stream)]
    raw.delete(stream)
    raw.xadd(stream, entry(2, 2, 0, 1, b"new"), id=old_id)  # type: ignore[arg-type]
    assert channel.receive(stream, timeout=2) == b"new"


def test_a_frame_taken_by_a_reader_that_died_is_not_delivered_again(
    redis_url: str, channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    """A receive records what it took as it takes it (the group delivers each entry once);
    deleting it waits for the reader's next read. A reader that dies in between leaves
    the frame on the stream, but its successor neither gets it again nor reports a gap."""
    for frame in (b"a", b"b", b"c"):
        channel.send(stream, frame)
    dying = RedisChannel(redis_url)
    assert dying.receive(stream, timeout=2) == b"a"
    dying._redis.connection_pool.disconnect()  # gone without closing: nothing deleted
    assert raw.xlen(stream) == 3
    successor = RedisChannel(redis_url)
    assert [successor.receive(stream, timeout=2) for _ in range(2)] == [b"b", b"c"]
    successor.close()
    assert raw.xlen(stream) == 0 and raw.hget(stream + ":seq", "read") == b"3"


def test_after_a_reset_a_stale_and_a_new_sender_lose_no_frame_of_theirs(
    redis_url: str, stream: str
) -> None:
    """The worker that takes a turn over resets the streams; the hospital's channel still
    counts from before, sends once more, then is replaced and says hello. Every frame sent
    after the reset arrives: the hello was once thrown away as "out of order" (entry 2,
    entry 3 expected), and both sides waited for each other until a timeout."""
    old, reader = RedisChannel(redis_url), RedisChannel(redis_url)
    for frame in (b"a", b"b"):
        old.send(stream, frame)
        assert reader.receive(stream, timeout=2) == frame
    reader.reset(stream)
    old.send(stream, b"stale")  # counted from 2: entry 3 on a stream numbered afresh
    old.close()
    new = RedisChannel(redis_url)
    new.send(stream, b"hello")
    new.close()
    with pytest.raises(ChannelError, match=r"entries 1\.\.2 are gone"):
        reader.receive(stream, timeout=2)
    assert reader.receive(stream, timeout=2) == b"stale"
    assert reader.receive(stream, timeout=2) == b"hello"
    reader.close()


def test_a_zero_timeout_takes_a_waiting_frame_without_blocking(
    channel: RedisChannel, stream: str
) -> None:
    with pytest.raises(ChannelTimeout):
        channel.receive(stream, timeout=0)
    channel.send(stream, b"ready" * CHUNK)  # several chunks
    assert channel.receive(stream, timeout=0) == b"ready" * CHUNK


def test_an_append_refused_by_redis_is_an_error_and_numbers_nothing_twice(
    channel: RedisChannel, stream: str, raw: redis.Redis
) -> None:
    channel.send(stream, b"one")
    assert channel.receive(stream, timeout=2) == b"one"
    raw.delete(stream)
    raw.set(stream, b"not a stream")  # XADD fails inside EXEC, HINCRBY does not
    with pytest.raises(ChannelError, match="WRONGTYPE"):
        channel.send(stream, b"two")
    raw.delete(stream)
    channel.send(stream, b"three")  # numbered after the lost one: the gap is reported
    with pytest.raises(ChannelError, match=r"entries 2\.\.2 are gone"):
        channel.receive(stream, timeout=2)
    assert channel.receive(stream, timeout=2) == b"three"


def test_replies_are_parsed_by_hiredis_and_chunks_go_out_uncopied(redis_url: str) -> None:
    """hiredis is a dependency: redis-py's pure-Python parser was most of a frame's time
    on the relay (issue 26). Its packer is not used: it copies every chunk twice, where
    redis-py's hands the chunk's memoryview to the socket as it is."""
    from redis._parsers import _HiredisParser

    channel = RedisChannel(redis_url)
    try:
        conn = channel._redis.connection_pool.get_connection()
        try:
            conn.connect()
            assert isinstance(conn._parser, _HiredisParser)
            chunk = memoryview(payload(64 * 1024))
            packed = conn.pack_commands([("XADD", "s", "*", "d", chunk)])
            assert any(piece is chunk for piece in packed), "the chunk was copied into the command"
            # The channel's own packer for its frames' commands: the same pieces, uncopied.
            command = ("XADD", "s", "MAXLEN", "~", 1024, "*", "s", 7, "d", chunk)
            ours = _pack([command, ("HSET", b"s:seq", "read", 7)])
            assert any(piece is chunk for piece in ours), "the chunk was copied into the command"
            theirs = conn.pack_commands([command, ("HSET", b"s:seq", "read", 7)])
            assert b"".join(ours) == b"".join(theirs)
        finally:
            channel._redis.connection_pool.release(conn)
    finally:
        channel.close()
