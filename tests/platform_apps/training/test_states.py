"""The transition table: the life of a job as a small graph."""

from __future__ import annotations

from training.states import TERMINAL, TRANSITIONS, JobState, Who, allowed


def test_final_states_have_no_way_out() -> None:
    assert not [pair for pair in TRANSITIONS if pair[0] in TERMINAL]


def test_every_state_is_reachable_from_draft() -> None:
    reached, frontier = {JobState.DRAFT}, [JobState.DRAFT]
    while frontier:
        state = frontier.pop()
        for source, target in TRANSITIONS:
            if source == state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(JobState)


def test_only_the_scheduler_starts_completes_or_fails_a_job() -> None:
    system_only = {pair for pair, who in TRANSITIONS.items() if who == Who.SYSTEM}
    assert system_only == {
        (JobState.SCHEDULED, JobState.RUNNING),
        (JobState.RUNNING, JobState.COMPLETED),
        (JobState.RUNNING, JobState.FAILED),
        (JobState.PAUSED, JobState.FAILED),
    }


def test_allowed_answers_none_for_unknown_pairs_and_states() -> None:
    assert allowed("draft", "running") is None
    assert allowed("draft", "exploded") is None
    assert allowed("running", "paused") == Who.ADMIN
