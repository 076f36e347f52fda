"""The three messages of one two-party PSI run, as bytes for the relay.

The client (the label party) sends a :class:`PsiRequest`: its identifiers, each hashed to
the P-256 curve and raised to its own secret key (33-byte compressed points, in its
order). The server (the other party) answers with a :class:`PsiResponse`, the same points
raised to its key too (same order), and a :class:`PsiSetup`, its own identifiers raised to
its key, sorted (so their order says nothing of the server's records), either as the
points themselves (``raw``: exact) or as a Golomb-compressed set of their hashes
(``gcs``: smaller, with a false-positive rate). The ECDH arithmetic is OpenMined's
``openmined-psi``; this module only carries its fields, strictly.

Layout (integers big-endian)::

    offset  size  field
    0       5     magic b"MSPSI"
    5       1     format version (1)
    6       1     kind: 1 request, 2 setup, 3 response
    7       1     session length S (1 to 200)
    8       S     session: printable ASCII naming the job and the pair (both sides build
                  it from what the coordinator scheduled; a message of another is refused)
    8+S     32    setup and response: SHA-256 of the request message they answer
                  (absent in a request)
    ...           body, by kind:
                  request, response: count N (4), then N points of 33 bytes
                  setup raw:  structure 1 (1), count N (4), N sorted points of 33 bytes
                  setup gcs:  structure 2 (1), div (4), hash range (8), length L (4), L bytes
    end-32  32    SHA-256 of every byte before it

The trailing SHA-256 finds a truncated or corrupted message; it is no signature. Who sent
a message is for the relay's hospital-to-hospital keys to say (docs/protocol.md).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import dataclass
from typing import ClassVar

from medsplit.psi.errors import PsiMessageError
from medsplit.psi.identifiers import MAX_IDENTIFIERS

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_GCS_BYTES",
    "MAX_SESSION_LENGTH",
    "POINT_BYTES",
    "PsiRequest",
    "PsiResponse",
    "PsiSetup",
]

MAGIC = b"MSPSI"
FORMAT_VERSION = 1
POINT_BYTES = 33
"""A compressed P-256 point: 0x02 or 0x03, then the 32-byte x coordinate."""
MAX_SESSION_LENGTH = 200
MAX_GCS_BYTES = 64 * MAX_IDENTIFIERS // 8
"""A Golomb-compressed set takes about log2(1/rate) + 2 bits per element: 64 bits is ample."""

_REQUEST, _SETUP, _RESPONSE = 1, 2, 3
_RAW, _GCS = 1, 2
_STRUCTURES = {"raw": _RAW, "gcs": _GCS}
_KIND_NAMES = {_REQUEST: "request", _SETUP: "setup", _RESPONSE: "response"}
_DIGEST = 32
_HEAD = len(MAGIC) + 3


@dataclass(frozen=True)
class PsiRequest:
    """The client's blinded identifiers: ``points`` holds ``count`` points back to back."""

    session: str
    points: bytes

    KIND: ClassVar[int] = _REQUEST

    def __post_init__(self) -> None:
        _check_session(self.session)
        _check_points(self.points, "request")

    @property
    def count(self) -> int:
        return len(self.points) // POINT_BYTES

    def elements(self) -> list[bytes]:
        return _split(self.points)

    def to_bytes(self) -> bytes:
        return _seal(_header(self.KIND, self.session) + _counted(self.points))

    @classmethod
    def from_bytes(cls, data: bytes, *, session: str) -> PsiRequest:
        """The request in ``data``, which must be of ``session``."""
        reader = _Reader(data, cls.KIND, session)
        points = reader.points("request")
        reader.end()
        return cls(session, points)

    def digest(self) -> bytes:
        """SHA-256 of this request's bytes: what its setup and response name."""
        return hashlib.sha256(self.to_bytes()).digest()


@dataclass(frozen=True)
class PsiResponse:
    """The client's points raised to the server's key too, in the request's order."""

    session: str
    answers: bytes
    points: bytes

    KIND: ClassVar[int] = _RESPONSE

    def __post_init__(self) -> None:
        _check_session(self.session)
        _check_answers(self.answers)
        _check_points(self.points, "response")

    @property
    def count(self) -> int:
        return len(self.points) // POINT_BYTES

    def elements(self) -> list[bytes]:
        return _split(self.points)

    def to_bytes(self) -> bytes:
        return _seal(_header(self.KIND, self.session) + self.answers + _counted(self.points))

    @classmethod
    def from_bytes(cls, data: bytes, *, session: str, answers: bytes) -> PsiResponse:
        """The response in ``data``, which must answer the request whose digest is
        ``answers``, in ``session``."""
        reader = _Reader(data, cls.KIND, session)
        reader.answers(answers)
        points = reader.points("response")
        reader.end()
        return cls(session, answers, points)


@dataclass(frozen=True)
class PsiSetup:
    """The server's blinded identifiers: sorted ``points`` (``raw``), or a Golomb-compressed
    set (``gcs``: ``div``, ``hash_range`` and ``bits``)."""

    session: str
    answers: bytes
    structure: str
    points: bytes = b""
    div: int = 0
    hash_range: int = 0
    bits: bytes = b""

    KIND: ClassVar[int] = _SETUP

    def __post_init__(self) -> None:
        _check_session(self.session)
        _check_answers(self.answers)
        if self.structure == "raw":
            _check_points(self.points, "setup")
            elements = _split(self.points)
            # Sorted, as the server sends them: in its own order they would tell the client
            # where in the server's records each shared patient sits.
            if any(a >= b for a, b in itertools.pairwise(elements)):
                raise PsiMessageError("raw setup points are not sorted and distinct")
            if self.div or self.hash_range or self.bits:
                raise PsiMessageError("a raw setup carries points only")
        elif self.structure == "gcs":
            if self.points:
                raise PsiMessageError("a gcs setup carries no points")
            if not 1 <= self.div < 64:
                raise PsiMessageError(f"gcs divisor {self.div} is not in 1..63")
            if not 1 <= self.hash_range < 2**63:
                raise PsiMessageError(f"gcs hash range {self.hash_range} is not in 1..2^63-1")
            if not 1 <= len(self.bits) <= MAX_GCS_BYTES:
                raise PsiMessageError(
                    f"gcs set of {len(self.bits):,} bytes (1 to {MAX_GCS_BYTES:,} allowed)"
                )
        else:
            raise PsiMessageError(f"setup structure {self.structure!r} is not raw or gcs")

    def elements(self) -> list[bytes]:
        """A raw setup's points, one by one."""
        return _split(self.points)

    def to_bytes(self) -> bytes:
        body = bytes([_STRUCTURES[self.structure]])
        if self.structure == "raw":
            body += _counted(self.points)
        else:
            body += struct.pack(">IQI", self.div, self.hash_range, len(self.bits)) + self.bits
        return _seal(_header(self.KIND, self.session) + self.answers + body)

    @classmethod
    def from_bytes(cls, data: bytes, *, session: str, answers: bytes) -> PsiSetup:
        """The setup in ``data``, which must answer the request whose digest is
        ``answers``, in ``session``."""
        reader = _Reader(data, cls.KIND, session)
        reader.answers(answers)
        (structure,) = reader.take(1)
        if structure == _RAW:
            points = reader.points("setup")
            reader.end()
            return cls(session, answers, "raw", points=points)
        if structure == _GCS:
            div, hash_range, length = struct.unpack(">IQI", reader.take(16))
            if not 1 <= length <= MAX_GCS_BYTES:
                raise PsiMessageError(
                    f"gcs set of {length:,} bytes (1 to {MAX_GCS_BYTES:,} allowed)"
                )
            bits = reader.take(length)
            reader.end()
            return cls(session, answers, "gcs", div=div, hash_range=hash_range, bits=bits)
        raise PsiMessageError(f"setup structure {structure} is not 1 (raw) or 2 (gcs)")


class _Reader:
    """Reads a message front to back, refusing anything out of place."""

    def __init__(self, data: bytes, kind: int, session: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise PsiMessageError(f"a PSI message is bytes, not {type(data).__name__}")
        data = bytes(data)
        name = _KIND_NAMES[kind]
        if len(data) < _HEAD + 1 + _DIGEST:
            raise PsiMessageError(f"PSI {name} truncated: {len(data)} bytes")
        if data[: len(MAGIC)] != MAGIC:
            raise PsiMessageError(f"not a PSI message (starts {data[:8]!r})")
        if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
            raise PsiMessageError(
                f"PSI {name} of {len(data)} bytes fails its checksum: truncated or altered"
            )
        version, found, length = data[len(MAGIC) : _HEAD]
        if version != FORMAT_VERSION:
            raise PsiMessageError(
                f"PSI message format {version}; this side reads format {FORMAT_VERSION}"
            )
        if found != kind:
            raise PsiMessageError(
                f"expected a PSI {name}, got kind {_KIND_NAMES.get(found, found)}"
            )
        self._data = data[:-_DIGEST]
        self._at = _HEAD
        self._name = name
        got = self.take(length).decode("ascii", errors="replace")
        if got != session:
            raise PsiMessageError(f"PSI {name} of session {got[:80]!r}, expected {session[:80]!r}")

    def take(self, size: int) -> bytes:
        if self._at + size > len(self._data):
            raise PsiMessageError(f"PSI {self._name} truncated")
        chunk = self._data[self._at : self._at + size]
        self._at += size
        return chunk

    def answers(self, expected: bytes) -> None:
        if self.take(_DIGEST) != expected:
            raise PsiMessageError(f"PSI {self._name} answers another request")

    def points(self, what: str) -> bytes:
        (count,) = struct.unpack(">I", self.take(4))
        if not 1 <= count <= MAX_IDENTIFIERS:
            raise PsiMessageError(f"{what} of {count:,} points (1 to {MAX_IDENTIFIERS:,})")
        return self.take(count * POINT_BYTES)

    def end(self) -> None:
        if self._at != len(self._data):
            raise PsiMessageError(
                f"PSI {self._name} has {len(self._data) - self._at} bytes past its end"
            )


def _header(kind: int, session: str) -> bytes:
    encoded = session.encode("ascii")
    return MAGIC + bytes([FORMAT_VERSION, kind, len(encoded)]) + encoded


def _seal(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def _counted(points: bytes) -> bytes:
    return struct.pack(">I", len(points) // POINT_BYTES) + points


def _split(points: bytes) -> list[bytes]:
    return [points[i : i + POINT_BYTES] for i in range(0, len(points), POINT_BYTES)]


def _check_session(session: object) -> None:
    if not isinstance(session, str) or not 1 <= len(session) <= MAX_SESSION_LENGTH:
        raise PsiMessageError(f"a PSI session is 1 to {MAX_SESSION_LENGTH} characters")
    if not all("!" <= c <= "~" for c in session):
        raise PsiMessageError(f"PSI session {session[:80]!r} is not printable ASCII")


def _check_answers(answers: object) -> None:
    if not isinstance(answers, bytes) or len(answers) != _DIGEST:
        raise PsiMessageError("a PSI setup or response names its request by a 32-byte digest")


def _check_points(points: object, what: str) -> None:
    if not isinstance(points, bytes):
        raise PsiMessageError(f"{what} points are bytes, not {type(points).__name__}")
    count, rest = divmod(len(points), POINT_BYTES)
    if rest or not 1 <= count <= MAX_IDENTIFIERS:
        raise PsiMessageError(
            f"{what} of {len(points):,} bytes is not 1 to {MAX_IDENTIFIERS:,} points of "
            f"{POINT_BYTES} bytes"
        )
    # Every compressed point starts 0x02 or 0x03; checking the first bytes finds a shifted
    # or misread body before the curve arithmetic does.
    prefixes = set(points[::POINT_BYTES])
    if not prefixes <= {2, 3}:
        raise PsiMessageError(f"{what} holds a point that is not a compressed P-256 point")
