"""The aggregator: sums the masked submissions of one round attempt, and nothing else.

It runs where the coordinator's workers run and sees only masked ring vectors. It checks
every submission before keeping it and sums only once every expected participant has
submitted; a bad submission fails the round, naming the hospital, and no sum is made.
"""

from __future__ import annotations

import numpy as np

from medsplit.secagg.errors import MessageError, RoundFailed, RoundIncomplete, SubmissionRejected
from medsplit.secagg.messages import Aggregate, MaskedSubmission
from medsplit.secagg.rounds import RoundId

__all__ = ["AGGREGATOR", "Aggregator"]

AGGREGATOR = "aggregator"
"""The sender an aggregate names."""


class Aggregator:
    """Collects the submissions of ``round_id`` (vectors of ``length`` ring values).

    Args:
        round_id: the round attempt: its job, round, attempt and participants.
        length: the number of values of the flattened front (the job's layout).
    """

    def __init__(self, round_id: RoundId, length: int) -> None:
        if not isinstance(round_id, RoundId):
            raise TypeError(f"expected a RoundId, got {type(round_id).__name__}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive integer, got {length!r}")
        self.round_id = round_id
        self.length = length
        self._vectors: dict[str, np.ndarray] = {}
        self._failed: SubmissionRejected | None = None

    @property
    def missing(self) -> tuple[str, ...]:
        """The participants that have not submitted yet, sorted."""
        return tuple(h for h in self.round_id.participants if h not in self._vectors)

    @property
    def complete(self) -> bool:
        return not self.missing and self._failed is None

    @property
    def failed(self) -> SubmissionRejected | None:
        """The rejection that failed this round, if one did."""
        return self._failed

    def receive(self, data: bytes, *, hospital: str) -> None:
        """Check and keep the submission ``data`` that came from ``hospital``.

        Args:
            data: the submission's bytes as read from the relay.
            hospital: the hospital the transport says it came from (the relay key or
                stream only that hospital's relay user may write).

        Raises:
            SubmissionRejected: the bytes are malformed; the hospital is not in the round,
                or the submission names another sender, job, round, attempt or
                participant set, another length or a dtype other than ``uint64``; or the
                hospital already submitted in this round (a replay). The round fails.
            RoundFailed: the round already failed.
        """
        if self._failed is not None:
            raise RoundFailed(
                f"round {self.round_id.round} of {self.round_id.job!r} already failed "
                f"({self._failed}); it takes no more submissions",
                hospital=self._failed.hospital,
            )
        try:
            self._vectors[hospital] = self._check(data, hospital)
        except SubmissionRejected as e:
            self._failed = e
            raise

    def _check(self, data: bytes, hospital: str) -> np.ndarray:
        rid = self.round_id
        where = f"round {rid.round} (attempt {rid.attempt}) of job {rid.job!r}"

        def reject(why: str) -> SubmissionRejected:
            return SubmissionRejected(
                f"submission from {hospital!r} refused: {why}; {where} fails and nothing is "
                "averaged",
                hospital=hospital,
            )

        if hospital not in rid.weights:
            raise reject(f"{hospital!r} is not a participant of {where} ({list(rid.weights)})")
        if hospital in self._vectors:
            raise reject("it already submitted in this round (a replayed submission)")
        try:
            sub = MaskedSubmission.from_bytes(data)
        except MessageError as e:
            raise reject(f"not a valid submission ({e})") from e
        if sub.sender != hospital:
            raise reject(f"it names {sub.sender!r:.80} as its sender")
        if sub.job != rid.job:
            raise reject(f"it is for job {sub.job!r:.80}")
        if (sub.round, sub.attempt) != (rid.round, rid.attempt):
            raise reject(f"it is for round {sub.round} attempt {sub.attempt}")
        if sub.round_digest != rid.digest():
            raise reject("it was masked for another participant set or weights")
        if sub.dtype != "uint64":
            raise reject(f"its vector is {sub.dtype}, not uint64 ring values")
        if sub.vector.shape[0] != self.length:
            raise reject(f"its vector has {sub.vector.shape[0]} values, not {self.length}")
        return sub.vector

    def aggregate(self) -> Aggregate:
        """The ring sum of every expected submission (still group-masked).

        Raises:
            RoundFailed: a submission was refused in this round.
            RoundIncomplete: some participants have not submitted (named in the message).
        """
        if self._failed is not None:
            raise RoundFailed(f"no aggregate: {self._failed}", hospital=self._failed.hospital)
        missing = self.missing
        if missing:
            raise RoundIncomplete(
                f"round {self.round_id.round} (attempt {self.round_id.attempt}) of "
                f"{self.round_id.job!r} still waits for {list(missing)}; a hospital that "
                "dropped out is left out by restarting the round without it "
                "(RoundId.restart_without), with fresh seeds",
                missing=missing,
            )
        first, *rest = self.round_id.participants
        total = self._vectors[first].copy()
        for hospital in rest:
            total += self._vectors[hospital]  # uint64 addition wraps: the ring Z/2^64
        return Aggregate.for_round(self.round_id, AGGREGATOR, total)
