"""The messages of secure aggregation, with strict ``to_bytes`` and ``from_bytes``.

Layout (integers big-endian)::

    offset  size    field
    0       8       magic b"MSSECAGG"
    8       1       format version (1)
    9       1       kind: 1 a masked submission, 2 the aggregate
    10      2       header length H
    12      H       header: canonical ASCII JSON {"attempt", "dtype", "job", "length",
                    "round", "round_digest", "sender"}
    12+H    L*s     the vector: L = length values of dtype (itemsize s), little-endian

``from_bytes`` refuses any other magic, version or kind, a header with other keys or
types, trailing or missing bytes. A header may name a dtype other than ``uint64`` (from a
faulty or hostile hospital): it still parses, so that the aggregator can refuse it naming
the hospital.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from medsplit.secagg.errors import MessageError
from medsplit.secagg.rounds import RoundId

__all__ = ["DTYPES", "FORMAT_VERSION", "MAGIC", "Aggregate", "MaskedSubmission"]

MAGIC = b"MSSECAGG"
FORMAT_VERSION = 1
DTYPES = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("uint64", "int64", "float32", "float64", "uint32", "int32")
}
"""The dtypes a header may name; only ``uint64`` is a ring vector."""
_KIND_SUBMISSION = 1
_KIND_AGGREGATE = 2
_PREFIX = len(MAGIC) + 4
_KEYS = ("attempt", "dtype", "job", "length", "round", "round_digest", "sender")
_MAX_HEADER = 4096


@dataclass(frozen=True, eq=False)  # numpy vectors have no single truth value
class _Message:
    """The fields both messages share; :attr:`vector` is a 1-D numpy array."""

    job: str
    round: int
    attempt: int
    round_digest: str
    sender: str
    vector: np.ndarray

    KIND: ClassVar[int] = 0

    @classmethod
    def for_round(cls, round_id: RoundId, sender: str, vector: np.ndarray) -> Any:
        """The message of ``sender`` for ``round_id``."""
        rid = round_id
        return cls(rid.job, rid.round, rid.attempt, rid.digest(), sender, vector)

    def __post_init__(self) -> None:
        if not isinstance(self.vector, np.ndarray) or self.vector.ndim != 1:
            raise MessageError("a message's vector must be a 1-D numpy array")
        if self.vector.dtype.name not in DTYPES:
            raise MessageError(f"a message's vector cannot be {self.vector.dtype}")

    @property
    def dtype(self) -> str:
        return self.vector.dtype.name

    def to_bytes(self) -> bytes:
        header = {
            "attempt": self.attempt,
            "dtype": self.dtype,
            "job": self.job,
            "length": int(self.vector.shape[0]),
            "round": self.round,
            "round_digest": self.round_digest,
            "sender": self.sender,
        }
        head = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        raw = head.encode("ascii")
        if len(raw) > _MAX_HEADER:
            raise MessageError(f"a message header holds at most {_MAX_HEADER} bytes")
        body = np.ascontiguousarray(self.vector, dtype=DTYPES[self.dtype]).tobytes()
        prefix = MAGIC + bytes([FORMAT_VERSION, self.KIND]) + len(raw).to_bytes(2, "big")
        return b"".join((prefix, raw, body))

    @classmethod
    def from_bytes(cls, data: bytes) -> Any:
        """The message in ``data``.

        Raises:
            MessageError: not such a message, another version or kind, a malformed header,
                or a vector whose bytes do not match the header's length and dtype.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MessageError(f"expected bytes, got {type(data).__name__}")
        view = memoryview(data).cast("B")
        if len(view) < _PREFIX or bytes(view[: len(MAGIC)]) != MAGIC:
            raise MessageError("these bytes are not a secure-aggregation message")
        version, kind = view[len(MAGIC)], view[len(MAGIC) + 1]
        if version != FORMAT_VERSION:
            raise MessageError(
                f"secure-aggregation message has format version {version}, this MedSplit "
                f"reads {FORMAT_VERSION}: the parties run incompatible releases"
            )
        if kind != cls.KIND:
            raise MessageError(f"expected a {cls.__name__} (kind {cls.KIND}), got kind {kind}")
        size = int.from_bytes(view[len(MAGIC) + 2 : _PREFIX], "big")
        if size > _MAX_HEADER or len(view) < _PREFIX + size:
            raise MessageError("secure-aggregation message header is truncated or too long")
        header = _parse_header(bytes(view[_PREFIX : _PREFIX + size]))
        dtype = DTYPES[header["dtype"]]
        body = view[_PREFIX + size :]
        if len(body) != header["length"] * dtype.itemsize:
            raise MessageError(
                f"the header announces {header['length']} {header['dtype']} values "
                f"({header['length'] * dtype.itemsize} bytes), the message carries "
                f"{len(body)} bytes: truncated or padded"
            )
        # Immutable bytes back the vector without a copy (read-only); anything else that
        # the caller could change afterwards is copied.
        vector = np.frombuffer(body, dtype=dtype).astype(
            dtype.newbyteorder("="), copy=not isinstance(data, bytes)
        )
        return cls(
            header["job"],
            header["round"],
            header["attempt"],
            header["round_digest"],
            header["sender"],
            vector,
        )


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise MessageError("secure-aggregation message header is not ASCII JSON") from None
    if not isinstance(header, dict) or sorted(header) != list(_KEYS):
        raise MessageError(f"secure-aggregation message header must hold exactly {list(_KEYS)}")
    for name in ("attempt", "length", "round"):
        value = header[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise MessageError(f"message header {name} must be a non-negative integer")
    for name in ("job", "round_digest", "sender", "dtype"):
        if not isinstance(header[name], str) or not header[name]:
            raise MessageError(f"message header {name} must be a non-empty string")
    if header["dtype"] not in DTYPES:
        raise MessageError(f"message header names an unknown dtype {header['dtype']!r:.40}")
    return header


@dataclass(frozen=True, eq=False)  # numpy vectors have no single truth value
class MaskedSubmission(_Message):
    """A hospital's masked ring vector for one round attempt (``sender``: the hospital)."""

    KIND: ClassVar[int] = _KIND_SUBMISSION


@dataclass(frozen=True, eq=False)  # numpy vectors have no single truth value
class Aggregate(_Message):
    """The ring sum of every participant's submission (``sender``: the aggregator); still
    hidden by the group masks."""

    KIND: ClassVar[int] = _KIND_AGGREGATE
