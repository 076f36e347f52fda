"""A round as the job's mode plans it: the turns of one group run at the same time, the
next group starts once they all ended, the failure policies hold per turn, and each turn
starts where the mode's start_from says (the previous hand-off, the job's seed or the
last group's states)."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from medsplit.modes import MODES, StartFrom
from tests.medsplit.test_modes import TOY
from training import runs, services
from training.models import Job, Turn
from training.plan import turn_start
from training.scheduling import job_advance_group
from training.states import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy mode (every hospital in one group; the next round from their mean) known
    to the coordinator, as MEDSPLIT_EXTRA_MODES would make it."""
    monkeypatch.setitem(MODES, TOY.name, TOY)


def started(make_job, **overrides) -> Job:
    return services.job_start(job=make_job(state="scheduled", **overrides))


def groups(job: Job, round_index: int = 0) -> list[int]:
    return list(
        Turn.objects.filter(job=job, round__index=round_index, attempt=1)
        .order_by("position")
        .values_list("group", flat=True)
    )


def test_a_round_robin_round_has_one_turn_per_group_in_order(make_job) -> None:
    job = started(make_job)
    assert groups(job) == [0, 1, 2]
    (first,) = services.group_start_next(job=job)
    assert first.position == 0 and services.group_start_next(job=job) == [first]


def test_the_turns_of_one_group_start_together_and_the_next_waits_for_all(
    make_job, parallel
) -> None:
    job = started(make_job, mode="toy", rounds=2)
    assert groups(job) == [0, 0, 0]
    running = services.group_start_next(job=job)
    assert [t.position for t in running] == [0, 1, 2]
    assert all(t.status == Turn.Status.RUNNING for t in running)
    services.turn_finish(turn=running[0], metrics={})
    services.turn_finish(turn=running[2], metrics={})
    # One turn of the group still runs: it is all there is to do.
    assert [t.pk for t in services.group_start_next(job=job)] == [running[1].pk]
    assert groups(job, 1) == []
    services.turn_finish(turn=running[1], metrics={})
    following = services.group_start_next(job=job)
    assert [(t.round.index, t.position) for t in following] == [(1, 0), (1, 1), (1, 2)]
    for turn in following:
        services.turn_finish(turn=turn, metrics={})
    assert services.group_start_next(job=job) == []
    assert Job.objects.get(pk=job.pk).state == JobState.COMPLETED


def test_a_retry_keeps_its_group_and_runs_beside_the_rest_of_it(make_job, parallel) -> None:
    job = started(make_job, mode="toy", on_failure="retry", max_retries=1)
    _a, b, _c = services.group_start_next(job=job)
    services.turn_fail(turn=b, reason="agent lost")
    retry = Turn.objects.get(job=job, position=1, attempt=2)
    assert retry.group == b.group == 0 and retry.status == Turn.Status.PENDING
    now = services.group_start_next(job=job)
    assert [(t.position, t.attempt) for t in now] == [(0, 1), (1, 2), (2, 1)]


def test_a_skipped_turn_does_not_hold_its_group_back(make_job, parallel) -> None:
    job = started(make_job, mode="toy", on_failure="skip", rounds=2)
    a, b, c = services.group_start_next(job=job)
    services.turn_fail(turn=a, reason="disk full")
    services.turn_finish(turn=b, metrics={})
    services.turn_finish(turn=c, metrics={})
    following = services.group_start_next(job=job)
    assert [(t.round.index, t.position) for t in following] == [(1, 0), (1, 1), (1, 2)]
    start = turn_start(turn=following[0])
    assert start.kind == StartFrom.AGGREGATE
    assert [t.pk for t in start.sources] == [b.pk, c.pk], "the skipped turn adds nothing"


def test_a_failing_turn_fails_a_parallel_job_and_closes_its_group(make_job, parallel) -> None:
    job = started(make_job, mode="toy", on_failure="fail")
    _a, b, _c = services.group_start_next(job=job)
    services.turn_fail(turn=b, reason="out of memory")
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert set(Turn.objects.filter(job=job).values_list("status", flat=True)) == {"failed"}


def test_where_a_turn_starts_follows_the_mode(make_job, parallel) -> None:
    chain = started(make_job, rounds=2)
    first = services.turn_start_next(job=chain)
    assert turn_start(turn=first) == turn_start(turn=first, completed=[])
    assert turn_start(turn=first).kind == StartFrom.INITIAL
    services.turn_finish(turn=first, metrics={})
    second = services.turn_start_next(job=chain)
    assert turn_start(turn=second).kind == StartFrom.PREVIOUS
    assert [t.pk for t in turn_start(turn=second).sources] == [first.pk]

    toy = started(make_job, mode="toy", rounds=2)
    round_0 = services.group_start_next(job=toy)
    assert {turn_start(turn=t).kind for t in round_0} == {StartFrom.INITIAL}
    for turn in round_0:
        services.turn_finish(turn=turn, metrics={})
    for turn in services.group_start_next(job=toy):
        start = turn_start(turn=turn)
        assert start.kind == StartFrom.AGGREGATE
        assert [t.pk for t in start.sources] == [t.pk for t in round_0]


def test_the_scheduler_sends_every_turn_of_the_group_no_worker_holds(make_job, parallel) -> None:
    job = make_job(state="scheduled", mode="toy")
    a, b, c = job_advance_group(job_id=job.pk)
    Turn.objects.filter(pk=b.pk).update(
        runner="w1", lease_expires_at=job.created_at.replace(year=2999)
    )
    assert [t.pk for t in job_advance_group(job_id=job.pk)] == [a.pk, c.pk]


def test_the_migration_gives_existing_turns_their_position_as_group(make_job) -> None:
    job = started(make_job)
    Turn.objects.filter(job=job).update(group=0)
    migration = importlib.import_module("training.migrations.0007_turn_group")
    migration.group_is_position(apps, None)
    assert groups(job) == [0, 1, 2]


def checkpoint(turn: Turn, step: int) -> None:
    runs.checkpoint_record(
        turn=turn,
        round_index=turn.round.index,
        step=step,
        path=f"job-{turn.job_id}/r{turn.round.index}-p{turn.position}-s{step}",
        sha256="0" * 64,
        size_bytes=1,
    )


def places(job: Job) -> set[tuple[int, int, int]]:
    return set(job.server_checkpoints.values_list("round_index", "position", "step"))


def test_each_turn_of_a_group_keeps_its_own_server_checkpoints_until_they_are_used(
    make_job, parallel, settings, tmp_path
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "CHECKPOINT_DIR": tmp_path}
    job = started(make_job, mode="toy", rounds=2)
    a, b, c = services.group_start_next(job=job)
    for turn in (a, b, c):
        checkpoint(turn, 0)
        checkpoint(turn, 1)
    runs.turn_complete(turn=a, metrics={})
    # b and c still run on theirs; a keeps its end, which the next round combines.
    assert places(job) == {(0, 0, 1), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1)}
    runs.turn_complete(turn=b, metrics={})
    runs.turn_complete(turn=c, metrics={})
    assert places(job) == {(0, 0, 1), (0, 1, 1), (0, 2, 1)}
    d, _e, _f = services.group_start_next(job=job)
    checkpoint(d, 0)
    runs.turn_complete(turn=d, metrics={})
    # e and f have yet to start from the combination of round 0's ends.
    assert places(job) == {(0, 0, 1), (0, 1, 1), (0, 2, 1), (1, 0, 0)}


def test_a_job_whose_mode_left_the_coordinators_configuration_fails_saying_so(
    make_job, monkeypatch
) -> None:
    monkeypatch.setitem(MODES, TOY.name, TOY)
    job = make_job(state="scheduled", mode="toy")
    monkeypatch.delitem(MODES, TOY.name)  # MEDSPLIT["EXTRA_MODES"] no longer names it
    assert job_advance_group(job_id=job.pk) == []
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "unknown mode 'toy'" in job.state_reason
    assert 'MEDSPLIT["EXTRA_MODES"] (MEDSPLIT_EXTRA_MODES)' in job.state_reason
    assert not Turn.objects.filter(job=job).exists()
