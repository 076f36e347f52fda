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
``MULTI``/``EXEC``, so a message is never half-written. The sender computes the numbers
from its own count (read from the hash on its first send to the stream, so a restarted
sender continues the numbering) and checks it against what ``HINCRBY`` answers: a counter
ahead of the count (another sender on the stream) is a ``ChannelError``; a counter behind
it (the relay restarted without its data, which redis-py rides over by reconnecting, or
the stream was reset) is moved up to the count, so the numbering goes on and the reader
reports the loss once. Receiving reads one
message (``XREAD``, blocking while there is none; ``XRANGE`` for the rest of a chunked
one), then deletes its entries and records how far it got in one ``MULTI``/``EXEC``,
before returning it, so consumed frames don't stay in Redis and a new reader continues
exactly where the last one stopped; appends trim the stream with
``MAXLEN ~ max_stream_len`` so frames nobody reads can't grow Redis without bound. Because the
numbers are contiguous, a reader sees every loss: entries trimmed before they were read
(or numbers taken but never appended, by an append that failed in Redis), a chunk missing
or out of place, a message cut short by the next one, entries taken by another reader,
counters gone with a relay that restarted, entries numbered by two senders out of step. It
reports a loss as a ``ChannelError`` and keeps the intact message after it for the next
``receive``: nothing still on a stream is thrown away (read entries are deleted, so an
entry still there was never delivered).
No Lua: agents' Redis users may not load scripts, since a script that loops would stall
the relay for everyone.

A reader that is told the job's bounds (``max_message_bytes``, ``max_backlog_bytes``: the
workers, reading what hospitals send) refuses an oversized message from its first chunk,
before fetching the rest (a chunk larger than ``chunk_bytes``, or more chunks than the
bound allows), and a stream that still holds more than the bound once a message is taken
(a sender flooding it): both are :class:`RelayAbuse`, naming the stream and the bound.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict

import redis
from redis.backoff import NoBackoff
from redis.connection import Encoder, PythonRespSerializer
from redis.retry import Retry

from medsplit.channel.base import Channel
from medsplit.channel.connect import RELAY_SCHEMES, connect, forget_slots, node_client
from medsplit.errors import ChannelError, ChannelTimeout, RelayAbuse

logger = logging.getLogger(__name__)

MiB = 1 << 20
SEQ_SUFFIX = ":seq"

_FIELDS = (b"s", b"m", b"i", b"n", b"d")
#: Arguments longer than this go to the socket on their own, uncopied (redis-py's own cutoff).
_PACK_CUTOFF = 6000


class RedisChannel(Channel):
    """Streams as Redis streams; one instance may send and receive on many streams.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
            ``unix:///path/to/socket``; ``redis+cluster://...`` or ``rediss+cluster://...``
            for a Redis Cluster (:mod:`medsplit.channel.connect`), whose streams must carry
            a hash tag (``RelayKeys`` names do), so a stream and its counters share a node.
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
        max_message_bytes: the largest message this reader accepts (``None``: no bound
            beyond ``max_stream_len`` chunks).
        max_backlog_bytes: what a stream this reader reads may still hold, in Redis'
            memory, once a message is taken (``None``: not checked; checking needs the
            ``MEMORY`` command, which agents' users do not have).

    Note:
        A payload may span at most ``max_stream_len`` chunks. Bytes in, bytes out: no
        response is decoded. Each stream is meant to have one reader at a time; a new
        reader (after a restart) continues where the last one stopped. Likewise one sender
        per stream: a sender keeps count of the stream's numbers, so a second sender, even
        one taking turns with it, puts its count out of step. Its next ``send`` then raises
        ``ChannelError`` (the frame went out, misnumbered; the reader reports it too) and
        the send after that continues from the counter. A new sender (after a restart)
        continues the numbering; a sender whose relay restarted (or whose stream was reset)
        under it continues its own, moving the counter up to it.
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
        max_message_bytes: int | None = None,
        max_backlog_bytes: int | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(RELAY_SCHEMES):
            raise ValueError(f"url must start with one of {', '.join(RELAY_SCHEMES)}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        if max_stream_len < 1:
            raise ValueError(f"max_stream_len must be at least 1, got {max_stream_len}")
        if connect_timeout <= 0 or socket_timeout <= 0:
            raise ValueError("connect_timeout and socket_timeout must be positive")
        options: dict[str, object] = {}
        if ssl_ca_certs is not None:
            if not url.startswith(("rediss://", "rediss+cluster://")):
                raise ValueError("ssl_ca_certs needs a rediss:// url")
            options["ssl_ca_certs"] = ssl_ca_certs
        for name, bound in (
            ("max_message_bytes", max_message_bytes),
            ("max_backlog_bytes", max_backlog_bytes),
        ):
            if bound is not None and bound < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {bound}")
        self.chunk_bytes = chunk_bytes
        self.max_stream_len = max_stream_len
        self.max_message_bytes = max_message_bytes
        self.max_backlog_bytes = max_backlog_bytes
        self._redis = connect(
            url,
            decode_responses=False,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            # No silent retries: a command retried after a lost reply could append a frame
            # twice or number entries nobody appends.
            retry=Retry(NoBackoff(), 0),
            # redis-py's own packer, even with hiredis installed: hiredis' packer copies a
            # chunk into bytes and then into one command buffer, where this one hands the
            # chunk's memoryview to the socket as it is (with hiredis it doubled the
            # round trip of 1 MiB: docs/benchmarks.md, issue 26). Replies are still parsed
            # by hiredis where it is installed.
            command_packer=PythonRespSerializer(
                _PACK_CUTOFF, Encoder("utf-8", "strict", decode_responses=False).encode
            ),
            **options,
        )
        if isinstance(self._redis, redis.Redis):
            kwargs = self._redis.connection_pool.connection_kwargs
            self.address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        else:
            nodes = self._redis.get_primaries()
            self.address = "cluster " + ",".join(sorted(n.name for n in nodes))
        #: The pool each borrowed connection goes back to (a cluster has one per node).
        self._pools: dict[int, redis.ConnectionPool] = {}
        self._last_id: dict[str, bytes] = {}
        self._last_seq: dict[str, int] = {}
        self._sent: dict[str, int] = {}
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
        counter = stream + SEQ_SUFFIX
        conn = self._connection("sending to", stream)
        healthy = False
        try:
            last = self._sent.pop(stream, None)
            if last is None:  # first send on this stream: continue the stored numbering
                conn.send_command("HGET", counter, "sent")
                last = int(conn.read_response() or 0)
            first = last + 1
            commands: list[tuple[object, ...]] = [("HINCRBY", counter, "sent", count)]
            xadd = ("XADD", stream, "MAXLEN", "~", self.max_stream_len, "*")
            for i, chunk in enumerate(chunks):
                commands.append((*xadd, "s", first + i, "m", first, "i", i, "n", count, "d", chunk))
            replies = _transaction(conn, commands)
            healthy = True
        except redis.RedisError as e:
            raise self._error("sending to", stream, e) from e
        finally:
            self._release(conn, healthy)
        numbered = replies[0]
        if isinstance(numbered, int) and numbered == last + count:
            self._sent[stream] = numbered  # only a confirmed count is trusted next time
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        if failed is not None:
            raise ChannelError(
                f"sending to stream {stream!r} on Redis at {self.address} failed: {failed}"
            )
        if isinstance(numbered, int) and numbered < last + count:
            self._counter_went_back(stream, found=numbered - count, counted=last, sent=last + count)
        if stream not in self._sent:
            raise ChannelError(
                f"stream {stream!r} was numbered by someone else: its counter reached "
                f"{numbered} where this sender expected {last + count} (another sender on the "
                f"stream); the frame went out as entries {first}..{last + count} and its "
                "reader will report the clash"
            )
        self.bytes_sent[stream] += size

    def _counter_went_back(self, stream: str, *, found: int, counted: int, sent: int) -> None:
        """The stream's counter (``found``) was behind this sender's count (``counted``):
        the relay lost its data since this sender last counted (a restart, which redis-py
        rides over by reconnecting without a word) or someone reset the stream. The frame
        went out numbered from the count, so the counter is moved up to it (``sent``):
        the numbering goes on without a clash, and the reader reports once that what came
        before is gone; the frame itself is delivered."""
        conn = self._connection("sending to", stream)
        healthy = False
        try:
            conn.send_command("HSET", stream + SEQ_SUFFIX, "sent", sent)
            conn.read_response()
            healthy = True
        except redis.RedisError as e:
            raise self._error("sending to", stream, e) from e
        finally:
            self._release(conn, healthy)
        self._sent[stream] = sent
        logger.warning(
            "stream %r on Redis at %s: its counter was at %d where this sender had counted "
            "%d (the relay restarted without its data, or the stream was reset); moved it to %d",
            stream,
            self.address,
            found,
            counted,
            sent,
        )

    def receive(self, stream: str, *, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        if stream in self._held:
            return self._held.pop(stream)
        while True:
            last_id = self._last_id.get(stream, b"0-0")
            conn = self._connection("receiving from", stream)
            healthy = False
            try:
                entries = self._read(conn, stream, last_id, deadline - time.monotonic())
                if entries:
                    self._last_id[stream] = entries[-1][0]
                    last = entries[-1][1].get(b"s", b"")
                    last = last if last.isdigit() else b""  # a garbled one is reported below
                    ids = [entry_id for entry_id, _ in entries]
                    prev, now, deleted = self._commit(conn, stream, last, ids)
                healthy = True
            except redis.RedisError as e:
                raise self._error("receiving from", stream, e) from e
            finally:
                self._release(conn, healthy)
            if entries:
                if deleted != len(ids):
                    self._last_seq.pop(stream, None)
                    raise ChannelError(
                        f"entries of stream {stream!r} were taken by another reader "
                        "while this one read them"
                    )
                return self._accept(stream, prev, now, entries)
            if time.monotonic() >= deadline:
                raise ChannelTimeout(f"no frame on stream {stream!r} within {timeout:g} s")

    def _accept(self, stream: str, read_before: int, read_now: int, entries: list) -> bytes:  # type: ignore[type-arg]
        """Check that ``entries`` continue what this reader last read, and join them.

        When frames were lost before them (trimmed, taken by another reader, gone with a
        relay that restarted) the error says so, and the intact message after the gap is
        kept for the next ``receive``. So is a message numbered out of order (by a sender
        counting from numbers the relay no longer holds): entries are deleted once read,
        so one still on the stream was never delivered, and it is new.
        """
        mine = self._last_seq.get(stream, read_before)
        self._last_seq[stream] = read_now
        first = _parse(stream, *entries[0])[0]
        lost = None
        if read_before > mine:
            lost = (
                f"entries {mine + 1}..{read_before} of stream {stream!r} were taken by "
                "another reader (or by a receive whose reply was lost)"
            )
        elif read_before < mine:
            lost = (
                f"the counters of stream {stream!r} went back from entry {mine} to "
                f"{read_before} (the relay restarted without its data, or the stream was "
                f"reset): frames sent after entry {mine} may be lost"
            )
        elif first > read_before + 1:
            lost = (
                f"frames on stream {stream!r} were trimmed before they were read: entries "
                f"{read_before + 1}..{first - 1} are gone (the reader fell more than "
                "max_stream_len entries behind, a sender failed between numbering and "
                "appending, or the relay restarted without its data)"
            )
        elif first <= read_before:
            lost = (
                f"entry {first} on stream {stream!r} is out of order: entry "
                f"{read_before + 1} was expected (its sender counted from numbers the relay "
                "no longer held: a restart or a reset); frames may be lost"
            )
        if self.max_message_bytes is not None:
            sizes = [len(fields.get(b"d", b"")) for _, fields in entries]
            if sum(sizes) > self.max_message_bytes or max(sizes) > self.chunk_bytes:
                raise RelayAbuse(
                    f"a message on stream {stream!r} holds {sum(sizes)} bytes in chunks of up "
                    f"to {max(sizes)}: more than this job's largest frame allows "
                    f"({self.max_message_bytes} bytes in chunks of {self.chunk_bytes})",
                    stream=stream,
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

    def reset(self, stream: str) -> None:
        """Delete ``stream`` and its counters in Redis, and forget this instance's place in it.

        For a party taking a stream over after a failure (a restarted Redis, a replaced
        worker): whatever was on it is dropped, numbering starts again at 1. Another
        instance still holding the old place finds out at its next use: as the sender it
        moves the counter up to its own count and goes on (see ``send``); as the reader
        it reports the reset once (``ChannelError``) and then delivers what follows.
        """
        try:
            self._redis.delete(stream, stream + SEQ_SUFFIX)
        except redis.RedisError as e:
            raise self._error("resetting", stream, e) from e
        for held in (self._last_id, self._last_seq, self._sent, self._held):
            held.pop(stream, None)

    def close(self) -> None:
        self._redis.close()

    def _connection(self, action: str, stream: str) -> redis.Connection:
        """A connection to the node holding ``stream`` (the one Redis, or on a cluster the
        node of its hash tag, where its counters are too)."""
        try:
            pool = node_client(self._redis, stream).connection_pool
            conn = pool.get_connection()
        except redis.RedisError as e:
            raise self._error(action, stream, e) from e
        self._pools[id(conn)] = pool
        return conn

    def _release(self, conn: redis.Connection, healthy: bool) -> None:
        """Give ``conn`` back; one left mid-command (replies unread) is closed first."""
        if not healthy:
            conn.disconnect()
        self._pools.pop(id(conn)).release(conn)

    def _read(
        self, conn: redis.Connection, stream: str, last_id: bytes, seconds: float
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """The next message's entries after ``last_id``, waiting at most ``seconds``.

        One ``XREAD`` (``BLOCK``) fetches the first entry, or waits for it; a message of
        several chunks fetches the rest with one ``XRANGE`` (as many as its first entry
        says). The wait is kept on the socket too: a Redis that neither answers nor
        times the ``BLOCK`` out is an error, never a reader held past its timeout.
        """
        if seconds > 0:
            block = ("BLOCK", max(1, int(seconds * 1000)))
            conn.send_command("XREAD", "COUNT", 1, *block, "STREAMS", stream, last_id)
            if not conn.can_read(timeout=seconds + 0.25):
                raise redis.TimeoutError(f"no answer to XREAD BLOCK within {seconds + 0.25:g} s")
        else:
            conn.send_command("XREAD", "COUNT", 1, "STREAMS", stream, last_id)
        entries = _stream_entries(conn.read_response())
        if not entries:
            return []
        count = entries[0][1].get(b"n", b"1")
        n = int(count) if count.isdigit() else 1
        self._check_size(stream, n, len(entries[0][1].get(b"d", b"")))
        if 1 < n <= self.max_stream_len:
            conn.send_command("XRANGE", stream, b"(" + entries[0][0], "+", "COUNT", n - 1)
            entries += _entries(conn.read_response())
        return entries

    def _check_size(self, stream: str, chunks: int, first: int) -> None:
        """Refuse a message whose first chunk shows it too large, before fetching the rest."""
        bound = self.max_message_bytes
        if bound is None:
            return
        most = max(1, -(-bound // self.chunk_bytes))
        if chunks > most or first > min(self.chunk_bytes, bound):
            raise RelayAbuse(
                f"stream {stream!r} holds a message of {chunks} chunk(s), the first of "
                f"{first} bytes: more than this job's largest frame allows ({bound} bytes, "
                f"at most {most} chunk(s) of {self.chunk_bytes}); it was not read",
                stream=stream,
            )

    def _commit(
        self, conn: redis.Connection, stream: str, last: bytes, ids: list[bytes]
    ) -> tuple[int, int, int]:
        """Delete the entries just read and record how far this reader got, atomically.

        Returns the last number read before and after, and how many entries were deleted:
        fewer than given means another reader took them first.
        """
        counter = stream + SEQ_SUFFIX
        commands: list[tuple[object, ...]] = [("HGET", counter, "read"), ("XDEL", stream, *ids)]
        if last:
            commands.append(("HSET", counter, "read", last))
        commands.append(("HGET", counter, "read"))
        if self.max_backlog_bytes is not None:
            # In the same transaction: what the sender left besides this message.
            commands.append(("MEMORY", "USAGE", stream, "SAMPLES", 0))
        replies = _transaction(conn, commands)
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        if failed is not None:
            raise failed
        if self.max_backlog_bytes is not None:
            held = int(replies.pop() or 0)
            if held > self.max_backlog_bytes:
                raise RelayAbuse(
                    f"stream {stream!r} still holds {held} bytes once a message is taken, more "
                    f"than this job allows ({self.max_backlog_bytes}): its sender is flooding it",
                    stream=stream,
                )
        before, deleted, now = replies[0], replies[1], replies[-1]
        return int(before or 0), int(now or 0), int(deleted)

    def _error(self, action: str, stream: str, cause: Exception) -> ChannelError:
        moved = isinstance(cause, redis.exceptions.AskError)  # MovedError is one too
        if moved or isinstance(cause, redis.ConnectionError):
            # On a cluster, the stream's slot moved or its node went (a failover): learn the
            # slots again for the next try. Nothing to do on one Redis.
            with contextlib.suppress(redis.RedisError):
                forget_slots(self._redis)
        if moved:
            cause = ChannelError(f"the cluster moved the stream's slot ({cause}); try again")
        return ChannelError(
            f"{action} stream {stream!r} on Redis at {self.address} failed: {cause}"
        )


def _transaction(conn: redis.Connection, commands: list[tuple[object, ...]]) -> list[object]:
    """Run ``commands`` in one ``MULTI``/``EXEC`` on ``conn``, in one write and one read.

    Returns ``EXEC``'s replies (an error of one command among them, as an exception
    object); raises a command refused before ``EXEC`` (then none of them ran).
    """
    conn.send_packed_command(conn.pack_commands([("MULTI",), *commands, ("EXEC",)]))
    refused = None
    for _ in range(len(commands) + 1):  # +OK, then +QUEUED for each
        try:
            conn.read_response()
        except redis.ResponseError as e:
            refused = refused or e
    try:
        replies = conn.read_response()
    except redis.ResponseError as e:  # EXECABORT, after a refused command
        raise refused or e from None
    if refused is not None:
        raise refused
    if not isinstance(replies, list) or len(replies) != len(commands):
        raise redis.ResponseError(f"unexpected reply to EXEC: {replies!r:.200}")
    return replies


def _stream_entries(reply: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an ``XREAD`` reply for one stream (RESP2 or RESP3), or none."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {stream: entries}
        return _entries(next(iter(reply.values())))
    return _entries(reply[0][1])  # type: ignore[index]


def _entries(reply: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """``[(id, {field: value})]`` from the raw entries of ``XRANGE`` or ``XREAD``."""
    entries = []
    for entry_id, fields in reply or []:  # type: ignore[attr-defined]
        if isinstance(fields, dict):
            entries.append((entry_id, fields))
        else:
            entries.append((entry_id, dict(zip(fields[::2], fields[1::2], strict=False))))
    return entries


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
