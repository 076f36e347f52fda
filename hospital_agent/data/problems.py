"""What is wrong with a hospital's local data, found before a turn starts.

Messages name the file (or CSV row) and the reason, and never carry pixel values: they
may leave the hospital in logs or in a status report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medsplit.errors import DataError

MAX_PROBLEMS = 10  # how many problems one error lists; the rest are only counted


@dataclass(frozen=True)
class Problem:
    """One problem: the file it concerns (``None`` when it concerns the whole dataset)
    and why it is a problem."""

    file: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}" if self.file else self.reason


class DataProblem(DataError):
    """The local data cannot be used; lists every problem found (up to :data:`MAX_PROBLEMS`).

    Attributes:
        problems: every problem listed, in the order found.
        total: how many problems were found, including those not listed.
        file: the first problem's file (``None`` when it concerns the whole dataset).
        reason: the first problem's reason.
    """

    def __init__(self, problems: Sequence[Problem], *, total: int | None = None) -> None:
        if not problems:
            raise ValueError("DataProblem needs at least one problem")
        self.problems = tuple(problems[:MAX_PROBLEMS])
        self.total = max(total or 0, len(problems))
        self.file = self.problems[0].file
        self.reason = self.problems[0].reason
        super().__init__(self._message())

    @classmethod
    def one(cls, file: str | None, reason: str) -> DataProblem:
        """An error holding a single problem."""
        return cls([Problem(file, reason)])

    def _message(self) -> str:
        if self.total == 1:
            return str(self.problems[0])
        lines = [f"{self.total} problems with the local data:"]
        lines += [f"  - {p}" for p in self.problems]
        if self.total > len(self.problems):
            lines.append(f"  ... and {self.total - len(self.problems)} more")
        return "\n".join(lines)


class Problems:
    """Collects problems while a source is read; :meth:`raise_if_any` at the end."""

    def __init__(self) -> None:
        self.found: list[Problem] = []
        self.total = 0

    def add(self, file: str | None, reason: str) -> None:
        self.total += 1
        if len(self.found) < MAX_PROBLEMS:
            self.found.append(Problem(file, reason))

    def __bool__(self) -> bool:
        return self.total > 0

    def raise_if_any(self) -> None:
        if self.found:
            raise DataProblem(self.found, total=self.total)
