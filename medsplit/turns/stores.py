"""Where a turn's saved states live, on either side: one interface, one error.

The server keeps *checkpoints* of its segment, each named by the last step it applied
(``-1``, :data:`~medsplit.turns.checkpoints.BASE`, is the turn's starting point); the
hospital keeps *snapshots* of its segments, each named by the step before which it was
taken (``0`` is the hand-off the turn started from). Both are
:func:`medsplit.protocol.handoff.export_parties` bytes (safetensors: loading one runs no
code) in a :class:`StateStore`; the handshake (:mod:`medsplit.turns.control`) pairs a
snapshot before ``s`` with the checkpoint after ``s - 1``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from medsplit.errors import MedSplitError


class StoreError(MedSplitError):
    """A saved state is missing, unreadable or not what its record says."""


class StateStore(ABC):
    """One turn's saved states on one side, by step (what a step names is the side's:
    see the module docstring)."""

    @abstractmethod
    def steps(self) -> list[int]:
        """The steps of the states that can be loaded, ascending."""

    @abstractmethod
    def load(self, step: int) -> bytes:
        """The state saved under ``step``.

        Raises:
            StoreError: there is none, or it does not verify.
        """

    @abstractmethod
    def save(self, step: int, data: bytes) -> None:
        """Keep ``data`` under ``step``, atomically; older ones may go (the turn's start
        never does)."""


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
        StoreError: the file is missing or its contents changed.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise StoreError(f"checkpoint file {path} cannot be read: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise StoreError(
            f"checkpoint file {path} does not match its record (sha256 {digest[:12]}..., "
            f"expected {sha256[:12]}...): it was changed or damaged"
        )
    return data
