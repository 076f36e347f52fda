"""The small interface every relay between two parties implements."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Channel(ABC):
    """Moves opaque frame bytes along named, ordered streams.

    A channel knows nothing of tensors: frames are encoded before ``send`` and decoded
    after ``receive`` (``medsplit.wire``), so every channel carries exactly the same bytes.
    """

    @abstractmethod
    def send(self, stream: str, payload: bytes) -> None:
        """Append ``payload`` to ``stream``."""

    @abstractmethod
    def receive(self, stream: str, *, timeout: float) -> bytes:
        """Take the oldest payload from ``stream``, waiting at most ``timeout`` seconds.

        Raises:
            ChannelTimeout: nothing arrived in time.
        """

    @abstractmethod
    def reset(self, stream: str) -> None:
        """Drop everything on ``stream`` and start it afresh (after a failure)."""

    def close(self) -> None:  # noqa: B027 - optional hook, most channels hold nothing
        """Release what the channel holds."""
