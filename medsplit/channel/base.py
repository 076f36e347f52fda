"""The small interface every relay between two parties implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamPair:
    """The two streams between one hospital and the server for one job."""

    up: str
    down: str

    @classmethod
    def for_hospital(cls, job: str, hospital: str) -> StreamPair:
        """Stream names for ``hospital`` in ``job``: agent to worker (up) and back (down)."""
        return cls(up=f"medsplit:{job}:{hospital}:up", down=f"medsplit:{job}:{hospital}:down")


HANDOFF_PREFIX = "medsplit-handoff"


def handoff_key(*, job: str, sender: str, recipient: str) -> str:
    """The relay key of the sealed hand-off of ``job`` from hospital ``sender`` to
    ``recipient`` (the recipient first: the relay's access rules are anchored on it)."""
    return f"{HANDOFF_PREFIX}:to:{recipient}:from:{sender}:job:{job}"


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
