"""One side's frames of one turn: receive, decode, drop what is not this turn's, send, count.

Both sides of a turn (:mod:`medsplit.turns.server`, :mod:`medsplit.turns.client`) read
and write their stream pair through a :class:`FrameIO`; what each side does with a frame
it received is its own state table's business (:mod:`medsplit.turns.states`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from medsplit.channel import Channel
from medsplit.errors import ChannelError, ChannelTimeout, FrameError, RelayAbuse
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameRejected
from medsplit.turns.control import TurnIds
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind, decode_frame, encode_frame

logger = logging.getLogger(__name__)


@dataclass
class FrameCounters:
    """What crossed one side's streams: every frame, re-sent and dropped ones included.

    ``waiting_seconds`` is the time spent waiting on the channel for a frame.
    """

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: int = 0
    waiting_seconds: float = 0.0


class FrameIO:
    """One side's end of one turn's stream pair.

    Args:
        channel: the relay (or an in-memory channel).
        inbound, outbound: the stream this side reads and the one it writes.
        ids: the turn: frames of another job, round or position are dropped (and counted).
        max_frame_bytes: the largest frame read or written; larger input is refused
            before it is parsed.
        where: how log lines name this side.
    """

    def __init__(
        self,
        channel: Channel,
        *,
        inbound: str,
        outbound: str,
        ids: TurnIds,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        where: str = "",
    ) -> None:
        self.channel = channel
        self.inbound = inbound
        self.outbound = outbound
        self.ids = ids
        self.max_frame_bytes = max_frame_bytes
        self.where = where or f"job {ids.job} round {ids.round} position {ids.position}"
        self.counters = FrameCounters()
        self._quiet_since = time.monotonic()

    # -- receiving ----------------------------------------------------------------------

    def listen(self) -> None:
        """Start waiting: the other side's silence is counted from now."""
        self._quiet_since = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since :meth:`listen` or since anything came in, whichever is later."""
        return time.monotonic() - self._quiet_since

    def receive(self, timeout: float) -> Frame | None:
        """This turn's next frame, or ``None`` when nothing of it came within ``timeout``
        seconds (a frame of another turn is dropped and counted; it resets the silence).

        Raises:
            FrameRejected: bytes that are not a frame (``well-formed``); nothing of them is
                applied, and the caller names the sender.
            RelayAbuse: the sender put more on the relay than its job allows.
            ChannelError: the relay failed.
        """
        began = time.monotonic()
        try:
            payload = self.channel.receive(self.inbound, timeout=max(timeout, 0.01))
        except ChannelTimeout:
            return None
        finally:
            self.counters.waiting_seconds += time.monotonic() - began
        self._quiet_since = time.monotonic()
        self.counters.frames_in += 1
        self.counters.bytes_in += len(payload)
        try:
            frame = decode_frame(payload, max_bytes=self.max_frame_bytes)
        except FrameError as e:
            raise FrameRejected(checks.WELL_FORMED, f"bytes that are not a frame: {e}") from e
        if self.ids.owns(frame):
            return frame
        self.drop(frame, "it belongs to another turn")
        return None

    def next_frame(
        self,
        *,
        silence_timeout: float,
        poll: float,
        interrupted: Callable[[], bool],
        silent: Callable[[float, str], Exception],
        wait_out_relay_errors: bool = False,
    ) -> Frame | None:
        """Wait for this turn's next frame, looking at ``interrupted()`` at least every
        ``poll`` seconds (``None`` as soon as it says so; it may raise instead).

        Args:
            silence_timeout: seconds without anything coming in before ``silent(waited,
                last_relay_error)`` is raised.
            wait_out_relay_errors: log a relay error and keep waiting (the other side's
                next hello, or the silence timeout, decides), instead of raising it. A
                :class:`~medsplit.errors.RelayAbuse` is raised either way.

        Raises:
            what :meth:`receive` raises, and ``silent(...)``.
        """
        self.listen()
        relay_error = ""
        while True:
            if interrupted():
                return None
            waited = self.silent_for()
            if waited >= silence_timeout:
                raise silent(waited, relay_error)
            try:
                frame = self.receive(min(poll, silence_timeout - waited))
            except RelayAbuse:
                raise
            except ChannelError as e:
                if not wait_out_relay_errors:
                    raise
                # Redis away, or frames lost on the stream: logged, never ignored.
                logger.warning("%s: relay: %s", self.where, e)
                relay_error = f"; last relay error: {e}"
                time.sleep(min(poll, 1.0))
                continue
            if frame is not None:
                return frame

    def answer(
        self,
        kind: FrameKind,
        index: int,
        *,
        timeout: float,
        failed: Callable[[str], Exception],
        unit: str = "batch",
        exchange: str = "request",
    ) -> Frame:
        """The server's ``kind`` answer to this side's ``unit`` number ``index``; other
        frames of this turn are dropped and counted (a late answer to an earlier batch).

        Raises:
            ``failed(message)``: nothing came for ``timeout`` seconds, or the server
                answered ``stopped`` (its frame checks refused something; the coordinator
                keeps the reason).
        """
        while True:
            frame = self.next_frame(
                silence_timeout=timeout,
                poll=min(1.0, timeout),
                interrupted=lambda: False,
                silent=lambda waited, err: failed(
                    f"no answer from the server for {waited:.0f} s at {unit} {index}{err}"
                ),
            )
            assert frame is not None  # never interrupted
            if frame.meta.kind == FrameKind.STOPPED:
                raise failed(
                    f"the server stopped the {exchange} at {unit} {frame.meta.step}: a "
                    "frame failed its checks (the coordinator keeps the reason)"
                )
            if frame.meta.kind == kind and frame.meta.step == index:
                return frame
            self.drop(frame, f"not the answer to {unit} {index}")

    # -- sending ------------------------------------------------------------------------

    def send(self, frame: Frame) -> int:
        """Encode and send ``frame``; returns its size in bytes.

        Raises:
            CodecError: it cannot be encoded within ``max_frame_bytes``.
            ChannelError: the relay failed.
        """
        payload = encode_frame(frame, max_bytes=self.max_frame_bytes)
        self.channel.send(self.outbound, payload)
        self.counters.frames_out += 1
        self.counters.bytes_out += len(payload)
        return len(payload)

    def drop(self, frame: Frame, why: str) -> None:
        """Leave ``frame`` unapplied, logged and counted."""
        self.counters.dropped += 1
        m = frame.meta
        logger.info(
            "%s: dropped a %s frame (round %d, position %d, step %d): %s",
            self.where,
            m.kind,
            m.round,
            m.position,
            m.step,
            why,
        )
