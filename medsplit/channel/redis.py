"""A channel over Redis streams, for parties in different processes or machines.

Entry layout: every payload becomes one or more entries of the Redis stream named like
the channel stream (``XADD``), with the fields

| field | value |
|---|---|
| ``s`` | the entry's sequence number on its stream: 1, 2, 3, ... (never reused) |
| ``m`` | the message id: the sequence number of the message's first chunk |
| ``i`` | the chunk's index within its message, from 0 |
| ``n`` | the message's chunk count (1 for a payload up to ``chunk_bytes``) |
| ``d`` | the chunk's bytes |

The sequence counter lives next to the stream, in the hash ``{stream}:seq`` (field
``sent``: the last number given out, field ``read``: the last number consumed). Sending
takes the numbers (``HINCRBY``) and appends every chunk of a message in one
``MULTI``/``EXEC``, so a message is never half-written. Receiving reads one message
(``XRANGE``), then deletes its entries and records how far it got in one ``MULTI``/``EXEC``,
so consumed frames don't stay in Redis; appends trim the stream with
``MAXLEN ~ max_stream_len`` so frames nobody reads can't grow Redis without bound.
Because the numbers are contiguous, a reader sees every loss: entries trimmed before they
were read (or numbered by a sender that died before appending them), a chunk missing or
out of place, a message cut short by the next one, entries taken by another reader.
No Lua: agents' Redis users may not load scripts, since a script that loops would stall
the relay for everyone.
"""

from __future__ import annotations

import time
from collections import defaultdict

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from medsplit.channel.base import Channel
from medsplit.errors import ChannelError, ChannelTimeout

MiB = 1 << 20
SEQ_SUFFIX = ":seq"

_FIELDS = (b"s", b"m", b"i", b"n", b"d")


class RedisChannel(Channel):
    """Streams as Redis streams; one instance may send and receive on many streams.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
            ``unix:///path/to/socket``.
        chunk_bytes: largest piece of a payload stored in one stream entry; larger
            payloads are split and put back together on receive.
        max_stream_len: entries a stream keeps before Redis trims the oldest (about:
            trimming is approximate); a reader that falls this far behind gets a
            ``ChannelError``, never a silently shortened stream.
        connect_timeout: seconds to wait for a connection to Redis.
        socket_timeout: seconds to wait for Redis to answer a command that moves frames.
            Waiting for a frame to arrive keeps to the ``receive`` timeout; taking one that
            has arrived may wait up to this long, as giving up on it could lose the frame.
        ssl_ca_certs: CA bundle to check the server's certificate with (``rediss://`` only).

    Note:
        A payload may span at most ``max_stream_len`` chunks. Bytes in, bytes out: no
        response is decoded. Each stream is meant to have one reader at a time; a new
        reader (after a restart) continues where the last one stopped. Likewise one sender
        per stream: two senders whose appends overtake each other are reported as frames
        out of order.
    """

    def __init__(
        self,
        url: str,
        *,
        chunk_bytes: int = 4 * MiB,
        max_stream_len: int = 1024,
        connect_timeout: float = 5.0,
        socket_timeout: float = 30.0,
        ssl_ca_certs: str | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must start with redis://, rediss:// or unix://")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        if max_stream_len < 1:
            raise ValueError(f"max_stream_len must be at least 1, got {max_stream_len}")
        if connect_timeout <= 0 or socket_timeout <= 0:
            raise ValueError("connect_timeout and socket_timeout must be positive")
        options: dict[str, object] = {}
        if ssl_ca_certs is not None:
            if not url.startswith("rediss://"):
                raise ValueError("ssl_ca_certs needs a rediss:// url")
            options["ssl_ca_certs"] = ssl_ca_certs
        self.chunk_bytes = chunk_bytes
        self.max_stream_len = max_stream_len
        self._redis = redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            # No silent retries: a command retried after a lost reply could append a frame
            # twice or number entries nobody appends.
            retry=Retry(NoBackoff(), 0),
            **options,
        )
        kwargs = self._redis.connection_pool.connection_kwargs
        self.address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self._last_id: dict[str, bytes] = {}
        self._last_seq: dict[str, int] = {}
        self._held: dict[str, bytes] = {}
        self.bytes_sent: defaultdict[str, int] = defaultdict(int)

    def send(self, stream: str, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            kind = type(payload).__name__
            raise ChannelError(f"payload for {stream!r} must be bytes, got {kind}")
        view = memoryview(payload).cast("B")
        size = len(view)
        chunks = [view[at : at + self.chunk_bytes] for at in range(0, size, self.chunk_bytes)]
        if not chunks:
            chunks = [view]
        if len(chunks) > self.max_stream_len:
            raise ChannelError(
                f"payload of {size} bytes for {stream!r} needs {len(chunks)} chunks of "
                f"{self.chunk_bytes} bytes, more than max_stream_len={self.max_stream_len}"
            )
        count = len(chunks)
        try:
            first = self._redis.hincrby(stream + SEQ_SUFFIX, "sent", count) - count + 1
            append = self._redis.pipeline(transaction=True)
            for i, chunk in enumerate(chunks):
                fields = {"s": first + i, "m": first, "i": i, "n": count, "d": chunk}
                append.xadd(stream, fields, maxlen=self.max_stream_len, approximate=True)
            append.execute()
        except redis.RedisError as e:
            raise self._error("sending to", stream, e) from e
        self.bytes_sent[stream] += size

    def receive(self, stream: str, *, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        if stream in self._held:
            return self._held.pop(stream)
        while True:
            last_id = self._last_id.get(stream, b"0-0")
            entries = self._read(stream, last_id)
            if entries:
                self._last_id[stream] = entries[-1][0]
                last = entries[-1][1].get(b"s", b"")
                last = last if last.isdigit() else b""  # a garbled one is reported below
                ids = [entry_id for entry_id, _ in entries]
                prev, now, deleted = self._commit(stream, last, ids)
                if deleted != len(ids):
                    self._last_seq.pop(stream, None)
                    raise ChannelError(
                        f"entries of stream {stream!r} were taken by another reader "
                        "while this one read them"
                    )
                return self._accept(stream, int(prev), int(now), entries)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._wait(stream, last_id, remaining):
                raise ChannelTimeout(f"no frame on stream {stream!r} within {timeout:g} s")

    def _accept(self, stream: str, read_before: int, read_now: int, entries: list) -> bytes:  # type: ignore[type-arg]
        """Check that ``entries`` continue what this reader last read, and join them.

        When frames were lost before them (trimmed, or taken by another reader) the error
        says so, and the intact message after the gap is kept for the next ``receive``.
        """
        mine = self._last_seq.get(stream, read_before)
        self._last_seq[stream] = read_now
        first = _parse(stream, *entries[0])[0]
        lost = None
        if read_before != mine:
            lost = (
                f"entries {mine + 1}..{read_before} of stream {stream!r} were taken by "
                "another reader (or by a receive whose reply was lost)"
            )
        elif first > read_before + 1:
            lost = (
                f"frames on stream {stream!r} were trimmed before they were read: entries "
                f"{read_before + 1}..{first - 1} are gone (the reader fell more than "
                "max_stream_len entries behind, or a sender failed between numbering and appending)"
            )
        elif first <= read_before:
            raise ChannelError(
                f"entry {first} on stream {stream!r} is out of order: "
                f"entry {read_before + 1} was expected"
            )
        try:
            payload = _assemble(stream, entries)
        except ChannelError as e:
            if lost:
                raise ChannelError(lost) from e
            raise
        if lost:
            self._held[stream] = payload
            raise ChannelError(lost + "; the next receive returns the frame after the gap")
        return payload

    def close(self) -> None:
        self._redis.close()

    def _read(self, stream: str, last_id: bytes) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """The next message's entries after ``last_id`` (as many as its first one says)."""
        try:
            entries = self._redis.xrange(stream, b"(" + last_id, count=1)
            if not entries:
                return []
            count = entries[0][1].get(b"n", b"1")
            n = int(count) if count.isdigit() else 1
            if 1 < n <= self.max_stream_len:
                entries = self._redis.xrange(stream, entries[0][0], count=n)
            return entries
        except redis.RedisError as e:
            raise self._error("receiving from", stream, e) from e

    def _wait(self, stream: str, last_id: bytes, seconds: float) -> bool:
        """Block until an entry after ``last_id`` exists on ``stream``, at most ``seconds``.

        The reply is awaited on the socket with the same deadline, so a slow or stuck
        Redis can't hold the reader past its timeout.
        """
        pool = self._redis.connection_pool
        try:
            conn = pool.get_connection()
        except redis.RedisError as e:
            raise self._error("receiving from", stream, e) from e
        healthy = False
        try:
            block_ms = max(1, int(seconds * 1000))
            conn.send_command("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", stream, last_id)
            if not conn.can_read(timeout=seconds + 0.25):
                return False
            reply = conn.read_response()
            healthy = True
            return bool(reply)
        except redis.RedisError as e:
            raise self._error("receiving from", stream, e) from e
        finally:
            if not healthy:
                conn.disconnect()
            pool.release(conn)

    def _commit(self, stream: str, last: bytes, ids: list[bytes]) -> tuple[int, int, int]:
        """Delete the entries just read and record how far this reader got, atomically.

        Returns the last number read before and after, and how many entries were deleted:
        fewer than given means another reader took them first.
        """
        counter = stream + SEQ_SUFFIX
        try:
            commit = self._redis.pipeline(transaction=True)
            commit.hget(counter, "read")
            commit.xdel(stream, *ids)
            if last:
                commit.hset(counter, "read", last)
            commit.hget(counter, "read")
            replies = commit.execute()
        except redis.RedisError as e:
            raise self._error("receiving from", stream, e) from e
        before, deleted, now = replies[0], replies[1], replies[-1]
        return int(before or 0), int(now or 0), int(deleted)

    def _error(self, action: str, stream: str, cause: Exception) -> ChannelError:
        return ChannelError(
            f"{action} stream {stream!r} on Redis at {self.address} failed: {cause}"
        )


def _assemble(stream: str, entries: list) -> bytes:  # type: ignore[type-arg]
    """Check that ``entries`` are one whole message, in order, and join its chunks."""
    parsed = [_parse(stream, entry_id, fields) for entry_id, fields in entries]
    seq, message, index, count, _ = parsed[0]
    if index != 0:
        raise ChannelError(
            f"message {message} on stream {stream!r} starts at chunk {index}: chunk 0 is missing"
        )
    for k, (s, m, i, n, _) in enumerate(parsed[1:], start=1):
        if m != message:
            raise ChannelError(
                f"message {message} on stream {stream!r} is unfinished ({k} of {count} chunks) "
                f"where message {m} begins"
            )
        if i != k or n != count or s != seq + k:
            raise ChannelError(
                f"message {message} on stream {stream!r}: chunk {i}/{n} (entry {s}) found "
                f"where chunk {k}/{count} (entry {seq + k}) was expected"
            )
    if len(parsed) < count:
        raise ChannelError(
            f"message {message} on stream {stream!r} is missing chunks: "
            f"{len(parsed)} of {count} found"
        )
    return parsed[0][4] if len(parsed) == 1 else b"".join(p[4] for p in parsed)


def _parse(
    stream: str, entry_id: bytes, fields: dict[bytes, bytes]
) -> tuple[int, int, int, int, bytes]:
    where = f"entry {entry_id.decode(errors='replace')} on stream {stream!r}"
    missing = [f.decode() for f in _FIELDS if f not in fields]
    if missing:
        raise ChannelError(f"{where} is not a channel entry: fields {missing} missing")
    try:
        s, m, i, n = (int(fields[f]) for f in _FIELDS[:4])
    except ValueError as e:
        raise ChannelError(f"{where} is garbled: {e}") from e
    if not (s >= 1 and 1 <= m <= s and 0 <= i < n):
        raise ChannelError(f"{where} is garbled: s={s} m={m} i={i} n={n}")
    return s, m, i, n, fields[b"d"]
