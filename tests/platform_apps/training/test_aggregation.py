"""A SplitFed round on the coordinator: its secure aggregation opens once the round's
turns ended, the next round (or the job's end) waits for it, and a hospital missing at
the round's deadline, a straggler included, is left to the job's failure policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kernel.actors import Actor, ActorKind
from training import services
from training.aggregation import (
    aggregation_claim,
    aggregation_done,
    aggregation_submit,
    aggregations_overdue,
    turns_overdue,
)
from training.models import Aggregation, Job, Turn
from training.plan import turn_start
from training.states import JobState

pytestmark = pytest.mark.django_db

SHA = "ab" * 32


def started(make_job, **overrides) -> Job:
    return services.job_start(
        job=make_job(
            state="scheduled",
            mode="splitfed",
            mode_options={"variant": "v1", "labels": "server"},
            **overrides,
        )
    )


def finish_round(job: Job, round_index: int) -> None:
    Turn.objects.filter(job=job, round__index=round_index).update(status=Turn.Status.COMPLETED)


def submit_all(aggregation: Aggregation, hospitals) -> None:
    for h in hospitals:
        if h.slug in aggregation.weights:
            aggregation_submit(
                actor=Actor(ActorKind.HOSPITAL, hospital=h),
                job_id=aggregation.job_id,
                round_index=aggregation.round_index,
                attempt=aggregation.attempt,
                sha256=SHA,
                size_bytes=100,
                counts={"front.bn.num_batches_tracked": [3]},
            )


def sum_it(aggregation: Aggregation) -> None:
    assert aggregation_claim(aggregation_id=aggregation.pk) is not None
    aggregation_done(aggregation_id=aggregation.pk, sha256="cd" * 32, size_bytes=100)


def test_the_next_round_waits_for_the_aggregation_and_starts_from_it(
    make_job, three_hospitals
) -> None:
    job = started(make_job)
    running = services.group_start_next(job=job)
    assert len(running) == 3, "the three hospitals train at once"
    finish_round(job, 0)
    assert services.group_start_next(job=job) == [], "no round 1 before the average"
    aggregation = Aggregation.objects.get(job=job)
    assert aggregation.weights == {h.slug: 40 for h in three_hospitals}
    submit_all(aggregation, three_hospitals)
    assert services.group_start_next(job=job) == [], "submitted, not yet summed"
    sum_it(aggregation)
    following = services.group_start_next(job=job)
    assert [t.round.index for t in following] == [1, 1, 1]
    start = turn_start(turn=following[0])
    assert start.aggregation == aggregation and start.weights == [40, 40, 40]


def test_the_job_completes_only_once_its_last_aggregation_is_done(make_job, three_hospitals):
    job = started(make_job, rounds=1)
    finish_round(job, 0)
    assert services.group_start_next(job=job) == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    aggregation = Aggregation.objects.get(job=job)
    submit_all(aggregation, three_hospitals)
    sum_it(aggregation)
    services.group_start_next(job=job)
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED


def test_a_hospital_silent_at_the_deadline_is_left_out_under_skip(make_job, three_hospitals):
    job = started(make_job, on_failure="skip")
    finish_round(job, 0)
    services.group_start_next(job=job)
    aggregation = Aggregation.objects.get(job=job)
    submit_all(aggregation, three_hospitals[:2])
    later = aggregation.deadline_at + timedelta(seconds=1)
    assert aggregations_overdue(now=later)[0].attempt == 1
    aggregation.refresh_from_db()
    assert aggregation.status == Aggregation.Status.RESTARTED
    following = Aggregation.objects.get(job=job, attempt=1)
    assert set(following.weights) == {h.slug for h in three_hospitals[:2]}
    assert following.dropped[0]["hospital"] == three_hospitals[2].slug
    assert following.submissions == {}, "every survivor masks again, with fresh seeds"


def test_a_hospital_silent_at_the_deadline_fails_the_job_under_fail(make_job, three_hospitals):
    job = started(make_job, on_failure="fail")
    finish_round(job, 0)
    services.group_start_next(job=job)
    aggregation = Aggregation.objects.get(job=job)
    aggregations_overdue(now=aggregation.deadline_at + timedelta(seconds=1))
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "had not submitted by the round's deadline" in job.state_reason
    assert not Aggregation.objects.filter(job=job, status="done").exists()


def test_a_straggler_past_the_deadline_is_skipped_and_the_round_goes_on_without_it(
    make_job, three_hospitals
) -> None:
    job = started(make_job, on_failure="skip", round_deadline_seconds=60)
    services.group_start_next(job=job)
    slow = three_hospitals[2]
    Turn.objects.filter(job=job).exclude(hospital=slow).update(status=Turn.Status.COMPLETED)
    assert turns_overdue(now=timezone.now() + timedelta(seconds=30)) == []
    assert len(turns_overdue(now=timezone.now() + timedelta(seconds=61))) == 1
    assert Turn.objects.get(job=job, hospital=slow).status == Turn.Status.SKIPPED
    services.group_start_next(job=job)
    aggregation = Aggregation.objects.get(job=job)
    assert set(aggregation.weights) == {h.slug for h in three_hospitals[:2]}
