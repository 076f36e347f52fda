"""The K-way intersection at the label party, in one common order, and its digest.

The label party intersects its own identifiers with each other party's (one PSI session
each, :mod:`medsplit.psi.session`) and hands the K-way intersection on as an
:class:`Alignment`. Its order is a pure function of the identifiers and the job's seed:
sorted by HMAC-SHA256 under a key derived from the seed, so it says nothing of where a
record sat in any party's files, and every party can check it is the order (no party
picks one). The digest is SHA-256 of the canonical encoding (:meth:`Alignment.to_bytes`);
the parties compare digests before training.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from medsplit.psi.errors import DigestMismatch, IntersectionTooSmall, PsiError, PsiMessageError
from medsplit.psi.identifiers import MAX_IDENTIFIER_LENGTH, MAX_IDENTIFIERS, check_identifiers

__all__ = ["ALIGNMENT_MAGIC", "Alignment", "align", "common_order", "order_key", "seed_bytes"]

ALIGNMENT_MAGIC = b"medsplit/psi/intersection/v1\n"
_SEED_BOUND = 2**64


def order_key(seed: int) -> bytes:
    """The HMAC key of the common order, derived from the job's seed (0 to 2^64 - 1)."""
    return hashlib.sha256(b"medsplit/psi/order/v1\0" + seed_bytes(seed)).digest()


def common_order(identifiers: Sequence[str], *, seed: int) -> tuple[str, ...]:
    """``identifiers`` sorted by their HMAC under :func:`order_key` (``seed``)."""
    key = order_key(seed)
    return tuple(
        sorted(identifiers, key=lambda i: (hmac.digest(key, i.encode("ascii"), "sha256"), i))
    )


@dataclass(frozen=True)
class Alignment:
    """The K-way intersection in the common order, for the job's ``seed``."""

    identifiers: tuple[str, ...]
    seed: int

    def __post_init__(self) -> None:
        if common_order(self.identifiers, seed=self.seed) != self.identifiers:
            raise PsiError("an alignment's identifiers must be in the seed's common order")

    def __len__(self) -> int:
        return len(self.identifiers)

    def to_bytes(self) -> bytes:
        """The canonical encoding: magic, count (4 bytes), then each identifier as its
        length (1 byte) and ASCII bytes."""
        parts = [ALIGNMENT_MAGIC, struct.pack(">I", len(self.identifiers))]
        for identifier in self.identifiers:
            encoded = identifier.encode("ascii")
            parts.append(bytes([len(encoded)]) + encoded)
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes, *, seed: int, minimum: int) -> Alignment:
        """The alignment in ``data`` (as the label party handed it on), checked: well
        formed, in the seed's order, and at least ``minimum`` long."""
        if not isinstance(data, bytes) or not data.startswith(ALIGNMENT_MAGIC):
            raise PsiMessageError("not an encoded alignment (wrong magic)")
        at = len(ALIGNMENT_MAGIC)
        if len(data) < at + 4:
            raise PsiMessageError("alignment truncated before its count")
        (count,) = struct.unpack_from(">I", data, at)
        at += 4
        if count > MAX_IDENTIFIERS:
            raise PsiMessageError(
                f"alignment of {count:,} identifiers (at most {MAX_IDENTIFIERS:,})"
            )
        values: list[str] = []
        for _ in range(count):
            if at >= len(data):
                raise PsiMessageError(f"alignment truncated after {len(values):,} identifiers")
            length = data[at]
            if not 1 <= length <= MAX_IDENTIFIER_LENGTH or at + 1 + length > len(data):
                raise PsiMessageError(f"alignment identifier {len(values) + 1} is malformed")
            values.append(data[at + 1 : at + 1 + length].decode("ascii", errors="replace"))
            at += 1 + length
        if at != len(data):
            raise PsiMessageError(f"alignment has {len(data) - at} bytes past its end")
        _check_minimum(len(values), minimum)
        # Checked like a party's own (distinct, well formed); the constructor checks the order.
        return cls(check_identifiers(values, source="the alignment received"), seed)

    def digest(self) -> str:
        """SHA-256 of :meth:`to_bytes`, in hex: what the parties compare."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def check_digest(self, other: str, *, party: str) -> None:
        """Refuse to go on if ``party`` reported another digest."""
        if not hmac.compare_digest(self.digest(), other):
            raise DigestMismatch(
                f"{party} holds another intersection (digest {other[:16]}…, here "
                f"{self.digest()[:16]}…): the parties are not aligned; training must not start"
            )

    def positions(self, local: Sequence[str], *, source: str) -> list[int]:
        """For each aligned identifier, its index in ``local`` (a party's own records, in
        its own order): the rows it feeds, step by step.

        Raises:
            PsiError: an aligned identifier is not among ``source``'s records.
        """
        index = {identifier: i for i, identifier in enumerate(local)}
        missing = [i for i in self.identifiers if i not in index]
        if missing:
            raise PsiError(
                f"{len(missing):,} aligned identifiers are not in {source} (first: "
                f"{missing[0]!r}): the intersection was not computed on this party's records"
            )
        return [index[i] for i in self.identifiers]


def align(
    own: Sequence[str], pairwise: Sequence[Sequence[str]], *, seed: int, minimum: int
) -> Alignment:
    """The label party's K-way intersection: ``own`` identifiers met with each of the K-1
    pairwise results (each a subset of ``own``), in the common order.

    Raises:
        PsiError: no pairwise result, or one holds identifiers not in ``own``.
        IntersectionTooSmall: fewer than ``minimum`` identifiers are shared by all.
    """
    if not pairwise:
        raise PsiError("a K-way intersection needs at least one pairwise result")
    _check_minimum(None, minimum)
    mine = frozenset(check_identifiers(own, source="the label party's identifiers"))
    shared = set(mine)
    for number, result in enumerate(pairwise, 1):
        found = set(result)
        if not found <= mine:
            raise PsiError(f"pairwise result {number} holds identifiers the label party lacks")
        shared &= found
    _check_minimum(len(shared), minimum)
    return Alignment(common_order(tuple(shared), seed=seed), seed)


def _check_minimum(size: int | None, minimum: int) -> None:
    """Refuse a ``minimum`` that is no positive integer, and a ``size`` below it."""
    if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1:
        raise PsiError(
            f"the job's minimum intersection must be a positive integer, got {minimum!r}"
        )
    if size is not None and size < minimum:
        raise IntersectionTooSmall(
            f"the parties share {size:,} records, below the job's minimum of {minimum:,}: "
            "aligning on so few could single out individual patients; the job does not start",
            size=size,
            minimum=minimum,
        )


def seed_bytes(seed: int) -> bytes:
    """The job's seed as the 8 big-endian bytes every derived key starts from."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < _SEED_BOUND:
        raise PsiError(f"the job's seed must be an integer in 0..2^64-1, got {seed!r}")
    return seed.to_bytes(8, "big")
