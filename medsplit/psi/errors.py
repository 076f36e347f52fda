"""The errors of record alignment: all derive from :class:`medsplit.errors.MedSplitError`."""

from __future__ import annotations

from medsplit.errors import DataError, MedSplitError


class PsiError(MedSplitError):
    """Private set intersection cannot go on (the message says what was wrong)."""


class IdentifierError(PsiError, DataError):
    """A party's identifiers cannot be used: duplicated, empty, malformed or too many.

    Attributes:
        source: the file (or other source) the identifiers came from.
        line: the 1-based line of the offending identifier, or 0 if none applies.
    """

    def __init__(self, message: str, *, source: str, line: int = 0) -> None:
        super().__init__(message)
        self.source = source
        self.line = line


class PsiMessageError(PsiError, ValueError):
    """Bytes are not a PSI message of this format, or not the one expected (truncated,
    altered, another session's, out of bounds)."""


class IntersectionTooSmall(PsiError):
    """The intersection is below the job's minimum: aligning on it could single out
    individual patients of a small consortium.

    Attributes:
        size: the intersection's size.
        minimum: the job's minimum.
    """

    def __init__(self, message: str, *, size: int, minimum: int) -> None:
        super().__init__(message)
        self.size = size
        self.minimum = minimum


class DigestMismatch(PsiError):
    """Two parties hold different ordered intersections: the job must not train."""
