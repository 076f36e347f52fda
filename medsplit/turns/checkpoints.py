"""Checkpoints of the server's segment during a turn, and writing them to disk safely.

A checkpoint is the server party's whole training state (weights, optimizer state,
schedule) as :func:`medsplit.protocol.handoff.export_parties` bytes: safetensors, so
loading one runs no code. It is named by the last step it applied; ``-1`` is the turn's
starting point (where the previous turn left the server, or the initial weights).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from medsplit.errors import MedSplitError

BASE = -1


class CheckpointError(MedSplitError):
    """A checkpoint is missing, unreadable or not what its record says."""


class CheckpointStore(ABC):
    """Where one turn's server checkpoints live. ``-1`` (the turn's start) always exists."""

    @abstractmethod
    def steps(self) -> list[int]:
        """Last-applied steps of the checkpoints that can be loaded, ``-1`` included."""

    @abstractmethod
    def load(self, step: int) -> bytes:
        """The bytes saved after ``step`` (``-1``: the turn's starting point).

        Raises:
            CheckpointError: there is none, or it does not verify.
        """

    @abstractmethod
    def save(self, step: int, data: bytes) -> None:
        """Keep ``data`` as the state after ``step``, atomically; older ones may go."""


class MemoryCheckpointStore(CheckpointStore):
    """Checkpoints in a dict: for simulations and tests. Keeps the last ``keep``."""

    def __init__(self, base: bytes, *, keep: int = 2) -> None:
        self._base = base
        self._saved: dict[int, bytes] = {}
        self.keep = keep
        self.saves = 0

    def steps(self) -> list[int]:
        return [BASE, *sorted(self._saved)]

    def load(self, step: int) -> bytes:
        if step == BASE:
            return self._base
        try:
            return self._saved[step]
        except KeyError:
            raise CheckpointError(f"no checkpoint after step {step}") from None

    def save(self, step: int, data: bytes) -> None:
        self._saved[step] = bytes(data)
        self.saves += 1
        for old in sorted(self._saved)[: -self.keep]:
            del self._saved[old]


def write_atomic(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same folder, are flushed to disk, and the
    file is renamed over ``path``; the folder is synced so the rename survives a crash.

    Returns:
        The SHA-256 of ``data`` in hex.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return hashlib.sha256(data).hexdigest()


def read_verified(path: Path, sha256: str) -> bytes:
    """The bytes of ``path``, checked against the SHA-256 its record holds.

    Raises:
        CheckpointError: the file is missing or its contents changed.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise CheckpointError(
            f"checkpoint file {path} does not match its record (sha256 {digest[:12]}..., "
            f"expected {sha256[:12]}...): it was changed or damaged"
        )
    return data
