"""Services: the state machine, round and turn progression, failure policies, metrics at a
bounded rate and hand-off metadata, against the real database."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from itertools import product

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from hospitals.models import Hospital
from kernel.actors import Actor
from kernel.errors import Conflict, InvalidInput, PermissionDenied
from training import services
from training.models import HandOff, Job, MetricPoint, Round, Turn
from training.states import TRANSITIONS, JobState, Who

pytestmark = pytest.mark.django_db
SYSTEM = Actor.system()


def actions(job: Job) -> list[str]:
    return list(
        AuditEvent.objects.filter(job_id=job.pk).order_by("id").values_list("action", flat=True)
    )


def run_turn(job: Job, **progress) -> Turn:
    turn = services.turn_start_next(job=job)
    assert turn is not None
    services.turn_record_progress(
        turn=turn,
        steps=progress.get("steps", 5),
        samples=progress.get("samples", 80),
        bytes_up=progress.get("bytes_up", 1000),
        bytes_down=progress.get("bytes_down", 900),
        loss=progress.get("loss", 0.5),
        final=True,
    )
    return services.turn_finish(turn=turn, metrics={"val_accuracy": 0.75})


# -- the state machine ------------------------------------------------------------------


@pytest.mark.parametrize(("current", "requested"), list(product(JobState, JobState)))
def test_job_transition_allows_exactly_the_table(make_job, current, requested) -> None:
    job = make_job(state=current)
    if (current, requested) in TRANSITIONS:
        moved = services.job_transition(job=job, to=requested, actor=SYSTEM, reason="test")
        assert moved.state == requested
        assert Job.objects.get(pk=job.pk).state == requested
        assert actions(job)[-1] == f"job.{requested.value}"
    else:
        with pytest.raises(Conflict) as refused:
            services.job_transition(job=job, to=requested, actor=SYSTEM)
        assert refused.value.details == {"state": current.value, "requested": requested.value}
        assert current.value in refused.value.message and requested.value in refused.value.message
        assert Job.objects.get(pk=job.pk).state == current
        assert actions(job) == ["job.created"]


@pytest.mark.parametrize(("pair", "who"), list(TRANSITIONS.items()))
def test_consortium_admin_may_ask_only_for_admin_transitions(make_job, admin_actor, pair, who):
    job = make_job(state=pair[0])
    if who == Who.ADMIN:
        assert services.job_transition(job=job, to=pair[1], actor=admin_actor).state == pair[1]
    else:
        with pytest.raises(PermissionDenied, match="only the scheduler"):
            services.job_transition(job=job, to=pair[1], actor=admin_actor)
        assert Job.objects.get(pk=job.pk).state == pair[0]


@pytest.mark.parametrize("actor_fixture", ["hospital_admin_actor", "observer_actor"])
def test_other_people_may_not_move_jobs(make_job, request, actor_fixture) -> None:
    actor = request.getfixturevalue(actor_fixture)
    job = make_job(state="draft")
    with pytest.raises(PermissionDenied):
        services.job_transition(job=job, to=JobState.SCHEDULED, actor=actor)
    assert Job.objects.get(pk=job.pk).state == JobState.DRAFT


def test_scheduling_needs_every_participant_still_enrolled(make_job, hospital_b) -> None:
    job = make_job()
    Hospital.objects.filter(pk=hospital_b.pk).update(status=Hospital.Status.SUSPENDED)
    with pytest.raises(Conflict, match="city-general"):
        services.job_transition(job=job, to=JobState.SCHEDULED, actor=SYSTEM)
    assert Job.objects.get(pk=job.pk).state == JobState.DRAFT


def test_transition_records_who_and_why(make_job, admin_actor) -> None:
    job = make_job()
    services.job_transition(job=job, to="cancelled", actor=admin_actor, reason="wrong cut")
    event = AuditEvent.objects.filter(job_id=job.pk, action="job.cancelled").get()
    assert event.actor == "person:ada"
    assert event.details["from"] == "draft" and event.details["reason"] == "wrong cut"
    job.refresh_from_db()
    assert job.state_reason == "wrong cut" and job.finished_at is not None


# -- rounds and turns -------------------------------------------------------------------


def test_three_hospitals_take_turns_in_order_over_two_rounds(make_job, three_hospitals) -> None:
    job = make_job(state="scheduled", rounds=2)
    job = services.job_start(job=job)
    assert job.state == JobState.RUNNING and job.started_at is not None
    assert list(Turn.objects.filter(job=job).values_list("position", "status")) == [
        (0, "pending"),
        (1, "pending"),
        (2, "pending"),
    ]
    order = []
    for _ in range(6):
        turn = run_turn(job)
        order.append((turn.round.index, turn.hospital.slug))
        assert turn.status == Turn.Status.COMPLETED
    slugs = [h.slug for h in three_hospitals]
    assert order == [(0, s) for s in slugs] + [(1, s) for s in slugs]
    assert services.turn_start_next(job=job) is None
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and job.finished_at is not None
    assert list(job.round_set.values_list("index", "status")) == [
        (0, "completed"),
        (1, "completed"),
    ]
    log = actions(job)
    assert log.count("turn.started") == 6 and log.count("turn.finished") == 6
    # Completing starts the evaluation of its final model (training/evaluation.py).
    assert log[-2:] == ["job.completed", "evaluation.started"] and "job.running" in log
    finished = AuditEvent.objects.filter(job_id=job.pk, action="turn.finished").first()
    assert finished.details["bytes_up"] == 1000 and finished.details["bytes_down"] == 900


def test_job_start_and_turn_start_next_are_idempotent(make_job) -> None:
    job = make_job(state="scheduled")
    services.job_start(job=job)
    services.job_start(job=job)
    assert Round.objects.filter(job=job).count() == 1
    assert Turn.objects.filter(job=job).count() == 3
    first = services.turn_start_next(job=job)
    again = services.turn_start_next(job=job)
    assert again.pk == first.pk
    assert Turn.objects.filter(job=job, status="running").count() == 1
    assert actions(job).count("turn.started") == 1


@pytest.mark.parametrize("state", ["draft", "paused", "cancelled"])
def test_job_start_starts_only_scheduled_jobs(make_job, state) -> None:
    job = make_job(state=state)
    with pytest.raises(Conflict, match="only a scheduled job can start"):
        services.job_start(job=job)
    assert not Round.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).state == state


def test_paused_job_starts_no_turn_until_resumed(make_job, admin_actor) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    services.job_transition(job=job, to="paused", actor=admin_actor)
    services.turn_finish(turn=turn, metrics={})  # the turn in flight may finish
    assert services.turn_start_next(job=job) is None
    services.job_transition(job=job, to="running", actor=admin_actor)
    assert services.turn_start_next(job=job).position == 1


def test_cancelling_closes_the_running_turn_and_skips_the_rest(make_job, admin_actor) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    services.job_transition(job=job, to="cancelled", actor=admin_actor)
    statuses = dict(Turn.objects.filter(job=job).values_list("position", "status"))
    assert statuses == {0: "failed", 1: "skipped", 2: "skipped"}
    assert Round.objects.get(job=job).status == Round.Status.CANCELLED
    with pytest.raises(Conflict, match="failed"):
        services.turn_finish(turn=turn, metrics={})
    assert services.turn_start_next(job=job) is None


def test_finishing_twice_is_a_no_op(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    services.turn_finish(turn=turn, metrics={"val_accuracy": 0.5})
    again = services.turn_finish(turn=turn, metrics={"val_accuracy": 0.9})
    assert again.metrics == {"val_accuracy": 0.5}
    assert actions(job).count("turn.finished") == 1


def test_finishing_a_pending_turn_or_failing_a_completed_one_conflicts(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    pending = Turn.objects.get(job=job, position=1)
    with pytest.raises(Conflict, match="pending"):
        services.turn_finish(turn=pending, metrics={})
    done = run_turn(job)
    with pytest.raises(Conflict, match="completed"):
        services.turn_fail(turn=done, reason="late")
    assert Turn.objects.get(pk=done.pk).status == Turn.Status.COMPLETED


def test_finish_refuses_bad_metrics(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    with pytest.raises(InvalidInput) as bad:
        services.turn_finish(turn=turn, metrics={"val_accuracy": float("nan")})
    assert "metrics" in bad.value.details
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.RUNNING


# -- failure policies -------------------------------------------------------------------


def test_retry_runs_the_turn_again_then_fails_the_job(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled", on_failure="retry", max_retries=1))
    first = services.turn_start_next(job=job)
    services.turn_fail(turn=first, reason="agent lost")
    services.turn_fail(turn=first, reason="agent lost")  # a retried task: no second retry
    retry = Turn.objects.get(job=job, position=0, attempt=2)
    assert retry.status == Turn.Status.PENDING and retry.hospital_id == first.hospital_id
    assert Turn.objects.filter(job=job, position=0).count() == 2
    assert services.turn_start_next(job=job).pk == retry.pk  # before the next hospital
    services.turn_fail(turn=retry, reason="agent lost again")
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "after 2 attempts" in job.state_reason and "agent lost again" in job.state_reason
    statuses = dict(Turn.objects.filter(job=job, attempt=1).values_list("position", "status"))
    assert statuses == {0: "failed", 1: "skipped", 2: "skipped"}
    failed = AuditEvent.objects.filter(job_id=job.pk, action="turn.failed").order_by("id")
    assert [e.details["outcome"] for e in failed] == ["retry", "job failed"]


def test_skip_marks_the_turn_skipped_and_goes_on(make_job, three_hospitals) -> None:
    job = services.job_start(job=make_job(state="scheduled", on_failure="skip", rounds=1))
    first = services.turn_start_next(job=job)
    skipped = services.turn_fail(turn=first, reason="disk full")
    assert skipped.status == Turn.Status.SKIPPED and skipped.failure_reason == "disk full"
    assert services.turn_start_next(job=job).hospital_id == three_hospitals[1].pk
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_fail_policy_fails_the_job_at_once(make_job) -> None:
    job = services.job_start(job=make_job(state="scheduled", on_failure="fail"))
    turn = services.turn_start_next(job=job)
    services.turn_fail(turn=turn, reason="out of memory")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "out of memory" in job.state_reason
    assert not Turn.objects.filter(job=job, attempt=2).exists()
    assert services.turn_start_next(job=job) is None


def test_a_turn_failing_while_paused_fails_the_job(make_job, admin_actor) -> None:
    job = services.job_start(job=make_job(state="scheduled", on_failure="fail"))
    turn = services.turn_start_next(job=job)
    services.job_transition(job=job, to="paused", actor=admin_actor)
    services.turn_fail(turn=turn, reason="crash")
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED


# -- metrics at a bounded rate ----------------------------------------------------------


@pytest.fixture
def running_turn(make_job, settings):
    settings.MEDSPLIT = {**settings.MEDSPLIT, "METRICS_MIN_INTERVAL_SECONDS": 5.0}
    job = services.job_start(job=make_job(state="scheduled", max_steps_per_turn=100))
    return services.turn_start_next(job=job)


def progress(turn, step, at, loss=1.0, final=False):
    return services.turn_record_progress(
        turn=turn,
        steps=step,
        samples=16 * step,
        bytes_up=100 * step,
        bytes_down=90 * step,
        loss=loss,
        final=final,
        at=at,
    )


def test_points_are_kept_at_most_once_per_interval(running_turn) -> None:
    t0 = timezone.now()
    stored = [
        progress(running_turn, step, t0 + timedelta(seconds=seconds)) is not None
        for step, seconds in [(1, 0), (2, 1), (3, 4.9), (4, 5), (5, 9), (6, 10.5)]
    ]
    assert stored == [True, False, False, True, False, True]
    assert list(MetricPoint.objects.filter(turn=running_turn).values_list("step", flat=True)) == [
        1,
        4,
        6,
    ]
    turn = Turn.objects.get(pk=running_turn.pk)  # counters follow every report
    assert (turn.steps, turn.samples, turn.bytes_up, turn.bytes_down) == (6, 96, 600, 540)


def test_the_final_step_is_always_kept(running_turn) -> None:
    t0 = timezone.now()
    progress(running_turn, 1, t0)
    assert progress(running_turn, 2, t0 + timedelta(seconds=1), final=True) is not None
    assert progress(running_turn, 100, t0 + timedelta(seconds=1.5)) is not None  # the cap


def test_finish_keeps_the_last_step_held_back_by_the_rate(running_turn) -> None:
    t0 = timezone.now()
    progress(running_turn, 1, t0)
    progress(running_turn, 2, t0 + timedelta(seconds=1), loss=0.25)
    services.turn_finish(turn=running_turn, metrics={})
    last = MetricPoint.objects.filter(turn=running_turn).order_by("-step").first()
    assert (last.step, last.loss) == (2, 0.25)


def test_repeated_or_stale_reports_change_nothing(running_turn) -> None:
    t0 = timezone.now()
    progress(running_turn, 4, t0)
    assert progress(running_turn, 4, t0 + timedelta(seconds=60)) is None  # same step again
    assert progress(running_turn, 2, t0 + timedelta(seconds=120)) is None  # arrived late
    assert MetricPoint.objects.filter(turn=running_turn).count() == 1
    assert Turn.objects.get(pk=running_turn.pk).steps == 4


def test_progress_refuses_bad_counters_and_finished_turns(running_turn) -> None:
    with pytest.raises(InvalidInput) as bad:
        services.turn_record_progress(
            turn=running_turn, steps=-1, samples=0, bytes_up=0, bytes_down=True, loss=None
        )
    assert set(bad.value.details) == {"steps", "bytes_down"}
    services.turn_finish(turn=running_turn, metrics={})
    with pytest.raises(Conflict, match="completed"):
        progress(running_turn, 9, timezone.now())


def test_a_diverging_loss_is_kept_as_null(running_turn) -> None:
    point = progress(running_turn, 1, timezone.now(), loss=float("inf"))
    assert point.loss is None
    assert Turn.objects.get(pk=running_turn.pk).last_loss is None


# -- hand-offs --------------------------------------------------------------------------


def test_handoff_keeps_only_size_and_hash(make_job, three_hospitals) -> None:
    a, b, _ = three_hospitals
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    digest = hashlib.sha256(b"ciphertext").hexdigest()
    handoff = services.handoff_record(
        turn=turn, sender=a, recipient=b, ciphertext_sha256=digest, size_bytes=4096
    )
    assert {f.name for f in HandOff._meta.get_fields()} == {
        "id",
        "job",
        "turn",
        "sender",
        "recipient",
        "ciphertext_sha256",
        "size_bytes",
        "created_at",
    }
    again = services.handoff_record(
        turn=turn, sender=a, recipient=b, ciphertext_sha256=digest, size_bytes=4096
    )
    assert again.pk == handoff.pk
    event = AuditEvent.objects.get(job_id=job.pk, action="handoff.recorded")
    assert event.details["size_bytes"] == 4096 and event.details["ciphertext_sha256"] == digest
    assert event.hospital == a.slug
    with pytest.raises(Conflict, match="another ciphertext"):
        services.handoff_record(
            turn=turn, sender=a, recipient=b, ciphertext_sha256="0" * 64, size_bytes=4096
        )


def test_handoff_refuses_bad_metadata(make_job, three_hospitals, hospital_admin) -> None:
    a, b, _ = three_hospitals
    outsider = Hospital.objects.create(name="Elsewhere", slug="elsewhere", status="enrolled")
    job = services.job_start(job=make_job(state="scheduled"))
    turn = services.turn_start_next(job=job)
    with pytest.raises(InvalidInput) as bad:
        services.handoff_record(
            turn=turn, sender=b, recipient=outsider, ciphertext_sha256="XYZ", size_bytes=0
        )
    assert set(bad.value.details) == {"ciphertext_sha256", "size_bytes", "sender", "recipient"}
    with pytest.raises(InvalidInput) as itself:
        services.handoff_record(
            turn=turn, sender=a, recipient=a, ciphertext_sha256="a" * 64, size_bytes=1
        )
    assert "itself" in itself.value.details["recipient"][0]
    pending = Turn.objects.get(job=job, position=1)
    with pytest.raises(Conflict, match="pending"):
        services.handoff_record(
            turn=pending, sender=b, recipient=a, ciphertext_sha256="a" * 64, size_bytes=1
        )
    assert not HandOff.objects.exists()


def test_job_create_is_for_consortium_admins(job_data, hospital_admin_actor) -> None:
    with pytest.raises(PermissionDenied):
        services.job_create(actor=hospital_admin_actor, data=job_data())
    assert not Job.objects.exists()


def test_job_create_stores_the_participants_in_order(job_data, admin_actor, three_hospitals):
    order = [three_hospitals[2], three_hospitals[0], three_hospitals[1]]
    job = services.job_create(
        actor=admin_actor, data=job_data(participants=[{"hospital": h.slug} for h in order])
    )
    assert [p.hospital_id for p in job.participants.order_by("position")] == [h.pk for h in order]
    assert job.created_by.get_username() == "ada"
    assert actions(job) == ["job.created"]
    config = job.training_config()
    assert config.cuts == ("pool1",) and config.client_optimizer.momentum == 0.9
