"""What identifies one secure-aggregation round: job, round, attempt, and who takes part
with which public weight.

Every mask, sealed seed and message is bound to the whole :class:`RoundId` (through
:meth:`RoundId.binding`), so nothing made for one attempt of a round opens, cancels or is
accepted in another, or with another participant set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from medsplit.secagg.errors import SecAggError

__all__ = ["MAX_NAME_CHARS", "RoundId"]

MAX_NAME_CHARS = 256
"""The longest job id or hospital name a round accepts (as :mod:`~medsplit.protocol.sealing`)."""
_MAX_INT = 2**63 - 1


@dataclass(frozen=True, eq=False)  # equality and hash by binding(), below
class RoundId:
    """One attempt of one aggregation round.

    Attributes:
        job: the job's id.
        round: the round, from 0.
        attempt: the attempt of this round, from 0; a restart (after a dropout or a
            refused submission) is the next attempt and draws fresh seeds.
        weights: each participant's public integer weight (its number of training
            samples), by hospital name; the participants are its keys, in sorted order.

    Raises:
        SecAggError: an empty or over-long name, a negative round or attempt, no
            participant, or a weight that is not a positive integer.
    """

    job: str
    round: int
    attempt: int
    weights: Mapping[str, int]

    def __post_init__(self) -> None:
        _check_name("job", self.job)
        for name in ("round", "attempt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
                raise SecAggError(f"a round's {name} must be an integer from 0, got {value!r}")
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise SecAggError("a round needs at least one participant with its weight")
        for hospital, weight in self.weights.items():
            _check_name("participant", hospital)
            if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
                raise SecAggError(
                    f"the weight of {hospital!r} must be a positive integer (its number of "
                    f"training samples), got {weight!r}"
                )
        if sum(self.weights.values()) > _MAX_INT:
            raise SecAggError("the weights of a round must sum to less than 2**63")
        ordered = dict(sorted(self.weights.items()))
        object.__setattr__(self, "weights", MappingProxyType(ordered))

    @property
    def participants(self) -> tuple[str, ...]:
        """The participants in sorted order: the order pairs and the leader are drawn in."""
        return tuple(self.weights)

    @property
    def total_weight(self) -> int:
        """The sum of the weights: what the unmasked sum is divided by."""
        return sum(self.weights.values())

    @property
    def leader(self) -> str:
        """The participant that draws the group key (the first in sorted order)."""
        return self.participants[0]

    def binding(self) -> bytes:
        """The round as canonical ASCII JSON: what masks, seeds and messages are bound to."""
        fields = {
            "attempt": self.attempt,
            "job": self.job,
            "round": self.round,
            "weights": [[h, w] for h, w in self.weights.items()],
        }
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode(
            "ascii"
        )

    def digest(self) -> str:
        """The SHA-256 of :meth:`binding` (hex), which messages carry."""
        return hashlib.sha256(self.binding()).hexdigest()

    def restart_without(self, dropped: Iterable[str]) -> RoundId:
        """The next attempt of this round without ``dropped``: it draws fresh seeds.

        Raises:
            SecAggError: a dropped hospital is not in the round, or nobody would be left.
        """
        gone = set(dropped)
        unknown = sorted(gone - set(self.weights))
        if unknown:
            raise SecAggError(f"cannot drop {unknown}: not participants of this round")
        left = {h: w for h, w in self.weights.items() if h not in gone}
        if not left:
            raise SecAggError("cannot restart the round without every participant")
        return RoundId(self.job, self.round, self.attempt + 1, left)

    def __hash__(self) -> int:
        return hash(self.binding())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoundId) and self.binding() == other.binding()


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise SecAggError(
            f"a round's {what} must be a non-empty string of at most {MAX_NAME_CHARS} "
            f"characters, got {value!r:.80}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SecAggError(f"a round's {what} {value!r:.80} holds control characters")
