"""Where a turn starts from, as the job's mode plans its rounds (reads only).

The mode's :meth:`~medsplit.modes.SplitMode.start_from` says the kind for a turn's round
and group; this module finds the turns whose end states that kind names, so that the
coordinator's assignment (the hospital's side) and the worker's turn runner (the
server's side) start from the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medsplit.modes import SplitMode, StartFrom, get_mode
from training.models import Aggregation, Job, Turn


@dataclass(frozen=True)
class TurnStart:
    """Where one turn starts: ``kind``, and the completed turns it starts from (none for
    :attr:`StartFrom.INITIAL`, one for :attr:`StartFrom.PREVIOUS`, the hospital's own last
    for :attr:`StartFrom.OWN`, the last group's for :attr:`StartFrom.AGGREGATE`), in
    position order.

    In a mode that aggregates securely, ``aggregation`` is the last group's aggregation
    that is done, and the sources are only its participants' turns (a hospital it left out
    is not averaged); no sources while it is not done."""

    kind: StartFrom
    sources: tuple[Turn, ...]
    aggregation: Aggregation | None = None

    @property
    def weights(self) -> list[int] | None:
        """Each source's public weight in the average (secure aggregation), else ``None``."""
        if self.aggregation is None:
            return None
        return [int(self.aggregation.weights[t.hospital.slug]) for t in self.sources]


def _secured(mode: SplitMode, job_id: int, kind: StartFrom, group: tuple[Turn, ...]) -> TurnStart:
    """The start from ``group``'s ends, through its aggregation where the mode has one."""
    if not mode.secure_aggregation or not group:
        return TurnStart(kind, group)
    last = group[-1]
    aggregation = Aggregation.objects.filter(
        job_id=job_id,
        round_index=last.round.index,
        group=last.group,
        status=Aggregation.Status.DONE,
    ).first()
    if aggregation is None:
        return TurnStart(kind, ())
    kept = tuple(t for t in group if t.hospital.slug in aggregation.weights)
    return TurnStart(kind, kept, aggregation)


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
    if kind == StartFrom.OWN:
        own = [t for t in before if t.hospital_id == turn.hospital_id]
        return TurnStart(kind, tuple(own[-1:]))
    last = (before[-1].round.index, before[-1].group)
    group = tuple(t for t in before if (t.round.index, t.group) == last)
    return _secured(mode, turn.job_id, kind, group)


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
    mode = get_mode(job.mode)
    kind = mode.result_from(job.rounds)
    ended = sorted(completed, key=lambda t: (t.round.index, t.group, t.position))
    if not ended:
        return TurnStart(kind, ())
    if kind == StartFrom.OWN:
        # Each hospital keeps its own: the last round's turns, one per hospital.
        last_round = ended[-1].round.index
        return TurnStart(kind, tuple(t for t in ended if t.round.index == last_round))
    if kind != StartFrom.AGGREGATE:
        return TurnStart(kind, (ended[-1],))
    last = (ended[-1].round.index, ended[-1].group)
    group = tuple(t for t in ended if (t.round.index, t.group) == last)
    return _secured(mode, job.pk, kind, group)
