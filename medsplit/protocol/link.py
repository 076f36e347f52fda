"""Drive one training step between a client and a server through a channel, in one thread."""

from __future__ import annotations

import dataclasses

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.protocol.roles import ClientRole, ServerRole, StepIds, StepResult
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, decode_frame, encode_frame


class LocalLink:
    """Carries frames both ways over a real channel, as encoded bytes.

    Simulations, ``medsplit verify`` and tests use it: every frame is encoded, sent,
    received and decoded against the receiver's expectations, exactly as between
    processes, only without a network in between.
    """

    def __init__(
        self,
        channel: Channel,
        streams: StreamPair,
        *,
        timeout: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ):
        self.channel = channel
        self.streams = streams
        self.timeout = timeout
        self.max_frame_bytes = max_frame_bytes

    def run_step(
        self,
        client: ClientRole,
        server: ServerRole,
        ids: StepIds,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> StepResult:
        """One full step: every exchange the mode needs, until the client's step is done."""
        bytes_up = bytes_down = 0
        outgoing: Frame = client.start(ids, x, y)
        while True:
            bytes_up += self._send(self.streams.up, outgoing)
            reply = server.handle(self._receive(self.streams.up, server))
            bytes_down += self._send(self.streams.down, reply)
            result = client.receive(self._receive(self.streams.down, client))
            if isinstance(result, StepResult):
                return dataclasses.replace(result, bytes_up=bytes_up, bytes_down=bytes_down)
            outgoing = result

    def _send(self, stream: str, frame: Frame) -> int:
        payload = encode_frame(frame, max_bytes=self.max_frame_bytes)
        self.channel.send(stream, payload)
        return len(payload)

    def _receive(self, stream: str, receiver: ClientRole | ServerRole) -> Frame:
        payload = self.channel.receive(stream, timeout=self.timeout)
        return decode_frame(payload, max_bytes=self.max_frame_bytes, expect=receiver.expect())
