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
reports the loss once.

Receiving takes one message through the stream's consumer group (``GROUP``, one consumer
name for every reader): ``XREADGROUP``, blocking while there is none, and a second one
for the rest of a chunked message. The group records the entries as delivered as it hands
them over, so a frame is delivered at most once even if its reader dies right after; the
reader acknowledges them (``XACK``) and records how far it got (``HSET ... read``) in the
same write as its next read (or at ``close``), and deletes them (``XDEL``) once ``XACK``
has confirmed that the group still held them, in a write Redis runs right after that
read, so a round trip is two calls. (A stream made afresh, by a reset or a relay that
restarted, numbers its entry ids from the clock again: an id may repeat an old one.) A
reader that starts on a stream makes sure of the group (``XGROUP CREATE ... MKSTREAM``)
and continues where the last one stopped: the ``read`` counter, or the entries the last
reader took and had not deleted yet (pending in the group), which are consumed; a group
that vanished under a reader (a relay restarted without its data, a reset) is made again
and the reader keeps its own place. Appends trim the stream with ``MAXLEN ~
max_stream_len`` so frames nobody reads can't grow Redis without bound. Because the
numbers are contiguous, a reader sees every loss: entries trimmed before they were read
(or numbers taken but never appended, by an append that failed in Redis), a chunk missing
or out of place, a message cut short by the next one, entries taken by another reader,
frames lost with a relay that restarted, entries numbered by two senders out of step. It
reports a loss as a ``ChannelError`` and keeps the intact message after it for the next
``receive``: nothing still on a stream is thrown away (an entry the group has not
delivered was never read).
No Lua: agents' Redis users may not load scripts, since a script that loops would stall
the relay for everyone.

A reader that is told the job's bounds (``max_message_bytes``, ``max_backlog_bytes``: the
workers, reading what hospitals send) refuses an oversized message from its first chunk,
before fetching the rest (a chunk larger than ``chunk_bytes``, or more chunks than the
bound allows), and a stream that still holds more than the bound besides the message just
taken (``MEMORY USAGE`` in the same write as the read, less that message's bytes: a sender
flooding it): both are :class:`RelayAbuse`, naming the stream and the bound.
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
#: Every stream's readers share one consumer group and one consumer name: the group
#: records what was delivered as it delivers it, so no later reader gets it again.
GROUP = "medsplit"
CONSUMER = "reader"
#: How Redis says a stream's group is gone (the stream deleted, under a blocked read too).
_GROUP_GONE = ("NOGROUP", "UNBLOCKED")
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
        #: Streams whose group this reader made sure of (``_attach``).
        self._attached: set[str] = set()
        self._last_seq: dict[str, int] = {}
        #: Per stream, the entries of the message taken last and the number read up to:
        #: acknowledged, recorded and deleted with the next read (or at ``close``).
        self._uncommitted: dict[str, tuple[list[bytes], int]] = {}
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
            conn = self._connection("receiving from", stream)
            healthy = False
            try:
                if stream not in self._attached:
                    self._attach(conn, stream)
                entries, held = self._take(conn, stream, deadline - time.monotonic())
                healthy = True
            except redis.RedisError as e:
                raise self._error("receiving from", stream, e) from e
            finally:
                self._release(conn, healthy)
            if entries:
                return self._accept(stream, entries, held)
            if stream in self._attached and time.monotonic() >= deadline:
                raise ChannelTimeout(f"no frame on stream {stream!r} within {timeout:g} s")

    def _attach(self, conn: redis.Connection, stream: str) -> None:
        """Make sure ``stream`` has its readers' group, and learn where its last reader
        stopped: the ``read`` counter, or further on, the message that reader took last and
        had not yet deleted (still pending in the group)."""
        counter = stream + SEQ_SUFFIX
        conn.send_packed_command(
            _pack(
                [
                    ("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM"),
                    ("HGET", counter, "read"),
                    ("XPENDING", stream, GROUP),
                ]
            )
        )
        created, read, pending = _replies(conn, 3)
        if isinstance(created, Exception) and not str(created).startswith("BUSYGROUP"):
            raise created
        for reply in (read, pending):
            if isinstance(reply, Exception):
                raise reply
        position = int(read) if isinstance(read, bytes) and read.isdigit() else 0
        taken: list[bytes] = []
        if pending and int(pending[0] or 0) > 0:  # type: ignore[index]
            conn.send_command("XRANGE", stream, pending[1], pending[2])  # type: ignore[index]
            for entry_id, fields in _entries(conn.read_response()):
                taken.append(entry_id)
                seq = fields.get(b"s", b"")
                if seq.isdigit():
                    position = max(position, int(seq))
        if taken:  # consumed by that reader: deleted with this reader's next read
            self._uncommitted[stream] = (taken, position)
        # A reader that was attached before (the group went with a relay restart or a
        # reset) keeps its own place: the numbering shows whether frames were lost.
        self._last_seq.setdefault(stream, position)
        self._attached.add(stream)

    def _take(
        self, conn: redis.Connection, stream: str, seconds: float
    ) -> tuple[list[tuple[bytes, dict[bytes, bytes]]], int | None]:
        """The next message's entries, taken for this reader's group, waiting at most
        ``seconds``; and what the stream held besides them (``max_backlog_bytes`` set).

        One write: the record of the message taken last (``XACK``, ``HSET ... read``;
        lazily: the group already records it as delivered, so no later reader gets it
        again) and one ``XREADGROUP`` (``BLOCK``) that takes the first entry or waits for
        it. Once ``XACK`` has confirmed that the group still held the last message's
        entries, a second write deletes them and asks the stream's ``MEMORY USAGE``; Redis
        runs it right after the ``XREADGROUP``, so a reader already waiting for its frame
        (as in a step) pays no round trip for it; one whose frame was there pays one. (Deleting them
        without that confirmation could delete a new frame: on a stream made afresh, by a
        reset or a restarted relay, entry ids start again from the clock and may repeat
        the old ones.) A message of several chunks takes the rest with one more
        ``XREADGROUP`` (as many as its first entry says). The wait is kept on the socket
        too: a Redis that neither answers nor times the ``BLOCK`` out is an error, never a
        reader held past its timeout.
        """
        counter = stream + SEQ_SUFFIX
        commands: list[tuple[object, ...]] = []
        done = self._uncommitted.get(stream)
        ids: list[bytes] = []
        if done is not None:
            ids, position = done
            if ids:
                commands.append(("XACK", stream, GROUP, *ids))
            commands.append(("HSET", counter, "read", position))
        block = ("BLOCK", max(1, int(seconds * 1000))) if seconds > 0 else ()
        read = ("XREADGROUP", "GROUP", GROUP, CONSUMER, "COUNT", 1, *block, "STREAMS", stream)
        commands.append((*read, ">"))
        conn.send_packed_command(_pack(commands))
        committed = _replies(conn, len(commands) - 1)
        for reply in committed:
            # A lost group fails the read too (below); anything else is refused outright.
            if isinstance(reply, Exception) and not str(reply).startswith(_GROUP_GONE):
                raise reply
        after: list[tuple[object, ...]] = []
        if ids and committed[0] == len(ids):  # still this group's: delivered, safe to delete
            after.append(("XDEL", stream, *ids))
        if self.max_backlog_bytes is not None:
            after.append(("MEMORY", "USAGE", stream, "SAMPLES", 0))
        if after:
            conn.send_packed_command(_pack(after))
        self._uncommitted.pop(stream, None)
        if seconds > 0 and not conn.can_read(timeout=seconds + 0.25):
            raise redis.TimeoutError(f"no answer to XREADGROUP BLOCK within {seconds + 0.25:g} s")
        taken, *rest = _replies(conn, 1 + len(after))
        memory = rest[-1:] if self.max_backlog_bytes is not None else []
        if isinstance(taken, redis.ResponseError) and str(taken).startswith(_GROUP_GONE):
            # The stream was deleted under its group: a relay restarted without its data,
            # or a reset. Attach again; what went missing shows in the numbering.
            logger.warning(
                "stream %r on Redis at %s lost its readers' group (%s); attaching again",
                stream,
                self.address,
                taken,
            )
            self._attached.discard(stream)
            return [], None
        for reply in (taken, *rest):
            if isinstance(reply, Exception):
                raise reply
        entries = _stream_entries(taken)
        if not entries:
            return [], None
        count = entries[0][1].get(b"n", b"1")
        n = int(count) if count.isdigit() else 1
        try:
            self._check_size(stream, n, len(entries[0][1].get(b"d", b"")))
            if 1 < n <= self.max_stream_len:
                conn.send_command(*read[:5], n - 1, "STREAMS", stream, ">")
                entries += _stream_entries(conn.read_response())
        finally:
            # Delivered to this group whatever follows: deleted with the next read.
            last = entries[-1][1].get(b"s", b"")
            position = int(last) if last.isdigit() else self._last_seq.get(stream, 0)
            self._uncommitted[stream] = ([entry_id for entry_id, _ in entries], position)
        if not memory:
            return entries, None
        besides = int(memory[0] or 0) - sum(len(f.get(b"d", b"")) for _, f in entries)
        return entries, besides

    def _accept(
        self, stream: str, entries: list[tuple[bytes, dict[bytes, bytes]]], held: int | None
    ) -> bytes:
        """Check that ``entries`` continue what this reader last read, and join them.

        When frames were lost before them (trimmed, taken by another reader, gone with a
        relay that restarted) the error says so, and the intact message after the gap is
        kept for the next ``receive``. So is a message numbered out of order (by a sender
        counting from numbers the relay no longer holds): the group delivers an entry
        once, so one it hands over was never read, and it is new.
        """
        bound = self.max_backlog_bytes
        if held is not None and bound is not None and held > bound:
            raise RelayAbuse(
                f"stream {stream!r} still holds {held} bytes once a message is taken, more "
                f"than this job allows ({bound}): its sender is flooding it",
                stream=stream,
            )
        mine = self._last_seq.get(stream, 0)
        self._last_seq[stream] = self._uncommitted[stream][1]
        first = _parse(stream, *entries[0])[0]
        lost = None
        if first > mine + 1:
            lost = (
                f"entries {mine + 1}..{first - 1} are gone from stream {stream!r}: trimmed "
                "before they were read (the reader fell more than max_stream_len entries "
                "behind), taken by another reader, numbered by a sender that failed before "
                "appending them, or lost with a relay that restarted without its data"
            )
        elif first <= mine:
            lost = (
                f"entry {first} on stream {stream!r} is out of order: entry {mine + 1} was "
                "expected (its sender counted from numbers the relay no longer held: a "
                "restart or a reset); frames may be lost"
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
        for held in (self._last_seq, self._sent, self._held, self._uncommitted):
            held.pop(stream, None)
        self._attached.discard(stream)

    def close(self) -> None:
        """Delete and record the messages taken last (a reader's next read would), then
        close the connections. Nothing is lost if that fails: the next reader of a stream
        finds its last message still pending in the group and skips it."""
        for stream, (ids, position) in list(self._uncommitted.items()):
            with contextlib.suppress(redis.RedisError, ChannelError):
                client = node_client(self._redis, stream)
                client.hset(stream + SEQ_SUFFIX, "read", position)
                if ids and client.xack(stream, GROUP, *ids) == len(ids):  # see _take
                    client.xdel(stream, *ids)
        self._uncommitted.clear()
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
    conn.send_packed_command(_pack([("MULTI",), *commands, ("EXEC",)]))
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


def _pack(commands: list[tuple[object, ...]]) -> list[bytes | memoryview]:
    """``commands`` in RESP, as pieces for one write: a chunk longer than
    ``_PACK_CUTOFF`` goes out as its own piece, uncopied, everything else into one buffer.

    What redis-py's own packer does, for this module's arguments only (bytes, memoryviews
    of bytes, str and int) and without its per-argument encoder: a frame's commands carry
    about twenty small arguments, and packing them was a tenth of a 64 KiB round trip.
    """
    pieces: list[bytes | memoryview] = []
    buffer = bytearray()
    for command in commands:
        buffer += b"*%d\r\n" % len(command)
        for arg in command:
            if isinstance(arg, str):
                arg = arg.encode()
            elif isinstance(arg, int):
                arg = b"%d" % arg
            size = len(arg)  # type: ignore[arg-type]
            buffer += b"$%d\r\n" % size
            if size > _PACK_CUTOFF:
                pieces.append(bytes(buffer))
                pieces.append(arg)  # type: ignore[arg-type]
                buffer = bytearray(b"\r\n")
            else:
                buffer += arg  # type: ignore[operator]
                buffer += b"\r\n"
    pieces.append(bytes(buffer))
    return pieces


def _replies(conn: redis.Connection, count: int) -> list[object]:
    """The next ``count`` replies on ``conn``, an error reply as an exception object."""
    replies: list[object] = []
    for _ in range(count):
        try:
            replies.append(conn.read_response())
        except redis.ResponseError as e:
            replies.append(e)
    return replies


def _stream_entries(reply: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an ``XREADGROUP`` reply for one stream (RESP2 or RESP3), or none."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {stream: entries}
        return _entries(next(iter(reply.values())))
    return _entries(reply[0][1])  # type: ignore[index]


def _entries(reply: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """``[(id, {field: value})]`` from the raw entries of ``XRANGE`` or ``XREADGROUP``."""
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
