"""The errors of secure aggregation: all derive from :class:`medsplit.errors.MedSplitError`."""

from __future__ import annotations

from medsplit.errors import MedSplitError


class SecAggError(MedSplitError):
    """Secure aggregation cannot go on (the message says what was wrong)."""


class FixedPointError(SecAggError, ValueError):
    """A tensor cannot be encoded in the ring: not float32, not finite, or too large for
    the scale and the round's total weight."""


class MessageError(SecAggError, ValueError):
    """Bytes are not a secure-aggregation message of this format (truncated, bad header)."""


class SeedError(SecAggError):
    """A sealed pairwise seed or group key does not open, or was made for another round,
    attempt, pair or participant set."""


class SubmissionRejected(SecAggError):
    """A masked submission was refused; the round fails and nothing is summed.

    Attributes:
        hospital: the hospital the submission came from (as the transport names it).
    """

    def __init__(self, message: str, *, hospital: str) -> None:
        super().__init__(message)
        self.hospital = hospital


class RoundIncomplete(SecAggError):
    """The aggregate was asked for before every expected hospital submitted.

    Attributes:
        missing: the hospitals that have not submitted, sorted.
    """

    def __init__(self, message: str, *, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


class RoundFailed(SecAggError):
    """The round already refused a submission: it yields no aggregate.

    Attributes:
        hospital: the hospital whose submission failed the round.
    """

    def __init__(self, message: str, *, hospital: str) -> None:
        super().__init__(message)
        self.hospital = hospital
