"""Where a turn starts from, as the job's mode plans its rounds (reads only).

The mode's :meth:`~medsplit.modes.SplitMode.start_from` says the kind for a turn's round
and group; this module finds the turns whose end states that kind names, so that the
coordinator's assignment (the hospital's side) and the worker's turn runner (the
server's side) start from the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medsplit.modes import StartFrom, get_mode
from training.models import Job, Turn


@dataclass(frozen=True)
class TurnStart:
    """Where one turn starts: ``kind``, and the completed turns it starts from (none for
    :attr:`StartFrom.INITIAL`, one for :attr:`StartFrom.PREVIOUS`, the last group's for
    :attr:`StartFrom.AGGREGATE`), in position order."""

    kind: StartFrom
    sources: tuple[Turn, ...]


def turn_start(*, turn: Turn, completed: Sequence[Turn] | None = None) -> TurnStart:
    """Where ``turn`` starts, by its job's mode.

    Args:
        turn: a turn with its ``round`` and ``job``.
        completed: the job's completed turns with their rounds, if already read.

    Raises:
        UnknownModeError: the job's mode is not registered here.
    """
    if completed is None:
        completed = list(
            Turn.objects.filter(job_id=turn.job_id, status=Turn.Status.COMPLETED).select_related(
                "round", "hospital"
            )
        )
    mode = get_mode(turn.job.mode)
    kind = mode.start_from(turn.round.index, turn.group)
    if kind == StartFrom.INITIAL:
        return TurnStart(kind, ())
    here = (turn.round.index, turn.group)
    before = sorted(
        (t for t in completed if (t.round.index, t.group) < here),
        key=lambda t: (t.round.index, t.group, t.position),
    )
    if not before:
        return TurnStart(kind, ())
    if kind == StartFrom.PREVIOUS:
        return TurnStart(kind, (before[-1],))
    last = (before[-1].round.index, before[-1].group)
    return TurnStart(kind, tuple(t for t in before if (t.round.index, t.group) == last))


def job_result(*, job: Job, completed: Sequence[Turn] | None = None) -> TurnStart:
    """Where ``job``'s result (its final weights) comes from, by its mode's
    :meth:`~medsplit.modes.SplitMode.result_from`: the last completed turn
    (:attr:`StartFrom.PREVIOUS`) or the last group's completed turns
    (:attr:`StartFrom.AGGREGATE`), in position order; no sources before any turn ended.

    Raises:
        UnknownModeError: the job's mode is not registered here.
    """
    if completed is None:
        completed = list(
            Turn.objects.filter(job_id=job.pk, status=Turn.Status.COMPLETED).select_related(
                "round", "hospital"
            )
        )
    kind = get_mode(job.mode).result_from(job.rounds)
    ended = sorted(completed, key=lambda t: (t.round.index, t.group, t.position))
    if not ended:
        return TurnStart(kind, ())
    if kind != StartFrom.AGGREGATE:
        return TurnStart(kind, (ended[-1],))
    last = (ended[-1].round.index, ended[-1].group)
    return TurnStart(kind, tuple(t for t in ended if (t.round.index, t.group) == last))
