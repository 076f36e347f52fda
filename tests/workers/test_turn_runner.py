"""The turn runner and the scheduler's services in one process, against the real Redis
and database: a whole job, exact; pause, resume and cancel within a step; a hospital
that never shows up; checkpoints on disk and their records."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from audit.models import AuditEvent
from kernel.actors import Actor
from medsplit.training.verify import deterministic
from tests.redis_server import forget_jobs
from tests.workers.hospitals import Hospitals, assert_exact, local_data
from training import services
from training.models import Job, MetricPoint, ServerCheckpoint, Turn
from training.runs import checkpoint_dir
from training.scheduling import job_advance
from training.states import JobState
from workers import turn_runner

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(settings, tmp_path, redis_url: str) -> Iterator[str]:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "CHECKPOINT_EVERY": 4,
        "TURN_SILENCE_SECONDS": 20.0,
        "TURN_LEASE_SECONDS": 5.0,
        "METRICS_MIN_INTERVAL_SECONDS": 0.0,
    }
    yield redis_url
    forget_jobs(redis_url, Job.objects.values_list("pk", flat=True))


def unique_seed() -> int:
    # Jobs are numbered by the database, and stream names carry the job id: a fresh seed
    # keeps a rerun from meeting an earlier run's frames with the same ids.
    return uuid.uuid4().int % 1000


def scheduled(make_job, admin_actor: Actor, **overrides) -> Job:
    job = make_job(seed=unique_seed(), **overrides)
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)


def drive(job: Job, *, runner: str = "test-runner") -> list[str]:
    """What the Celery tasks do, in this process: advance, run the turn, advance..."""
    outcomes = []
    while (turn := job_advance(job_id=job.pk)) is not None:
        outcomes.append(turn_runner.run(turn.pk, runner=runner).outcome)
    return outcomes


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_a_job_runs_turn_by_turn_and_equals_unsplit_training(
    runtime: str, make_job, admin_actor: Actor, mode: str
) -> None:
    cuts = ["pool1"] if mode == "vanilla" else ["pool1", "pool"]
    job = scheduled(make_job, admin_actor, mode=mode, cuts=cuts, max_steps_per_turn=6)
    train, val = local_data(job, 96), local_data(job, 20)
    with deterministic():
        hospitals = Hospitals(job, runtime, train, val).start()
        assert drive(job) == ["completed"] * 6
        hospitals.join(30)
        assert_exact(hospitals)
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED
    turns = list(Turn.objects.filter(job=job).order_by("id"))
    assert [t.status for t in turns] == [Turn.Status.COMPLETED] * 6
    assert all(t.steps == 6 and t.samples == 6 * 16 for t in turns)
    assert all({"val_accuracy", "val_loss", "train_loss"} <= set(t.metrics) for t in turns)
    assert all(t.metrics["val_samples"] == 20 for t in turns)
    assert all(t.bytes_up > 0 and t.bytes_down > 0 for t in turns)
    assert MetricPoint.objects.filter(job=job).count() >= 6
    # What crossed is in the audit log as names and dtypes (invariant 2): labels go up in
    # vanilla mode only; no image does, ever.
    for event in AuditEvent.objects.filter(job_id=job.pk, action="turn.finished"):
        up = event.details["crossed"]["up"]
        assert ("labels" in up["activations"]) == (mode == "vanilla"), up
        assert set(up) <= {"rejoin", "activations", "head_gradients", "eval_activations", "metrics"}
    # Only the job's server state is kept, as a file that matches its record.
    kept = list(ServerCheckpoint.objects.filter(job=job))
    assert [c.pk for c in kept] == [job.server_checkpoint_id]
    files = sorted(p.name for p in (checkpoint_dir() / f"job-{job.pk}").iterdir())
    assert files == [kept[0].path.split("/")[-1]]


def test_pause_and_cancel_take_effect_within_a_step(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    job = scheduled(make_job, admin_actor, max_steps_per_turn=400, rounds=1)
    train = local_data(job, 16 * 400)
    hospitals = Hospitals(job, runtime, train, [None] * 3).start()
    turn = job_advance(job_id=job.pk)
    result: dict[str, str] = {}
    thread = threading.Thread(
        target=lambda: result.update(outcome=turn_runner.run(turn.pk, runner="r1").outcome)
    )
    thread.start()
    steps_at_pause = wait_for_steps(turn, 5)
    services.job_transition(job=job, to=JobState.PAUSED, actor=admin_actor)
    thread.join(20)
    assert result["outcome"] == "paused"
    turn.refresh_from_db()
    # Progress is stored at most every interval; the pause came within a step or two.
    assert turn.steps <= steps_at_pause + 3
    assert turn.runner == ""
    assert ServerCheckpoint.objects.filter(turn=turn).exists(), "paused state is checkpointed"

    services.job_transition(job=job, to=JobState.RUNNING, actor=admin_actor)
    thread = threading.Thread(
        target=lambda: result.update(outcome=turn_runner.run(turn.pk, runner="r2").outcome)
    )
    thread.start()
    wait_for_steps(turn, turn.steps + 5)
    services.job_transition(job=job, to=JobState.CANCELLED, actor=admin_actor)
    thread.join(20)
    assert result["outcome"] == "stopped"
    with pytest.raises(Exception, match="stopped"):
        hospitals.join(20)
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert turn.steps < 400


def wait_for_steps(turn: Turn, steps: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        turn.refresh_from_db()
        if turn.steps >= steps:
            return turn.steps
        time.sleep(0.02)
    raise AssertionError(f"turn {turn.pk} did not reach step {steps} (at {turn.steps})")


@pytest.mark.parametrize(
    ("policy", "job_state", "turn_states"),
    [
        ("skip", JobState.COMPLETED, ["skipped", "skipped", "skipped"]),
        ("fail", JobState.FAILED, ["failed", "skipped", "skipped"]),
        ("retry", JobState.FAILED, ["failed", "skipped", "skipped", "failed"]),
    ],
)
def test_a_hospital_that_does_not_show_up_fails_its_turn_as_the_policy_says(
    runtime: str, settings, make_job, admin_actor: Actor, policy, job_state, turn_states
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "TURN_SILENCE_SECONDS": 0.5}
    job = scheduled(make_job, admin_actor, rounds=1, on_failure=policy, max_retries=1)
    drive(job)
    job.refresh_from_db()
    assert job.state == job_state
    assert list(Turn.objects.filter(job=job).order_by("id").values_list("status", flat=True)) == (
        turn_states
    )
    failed = AuditEvent.objects.filter(job_id=job.pk, action="turn.failed").first()
    assert failed is not None
    assert "sent nothing" in failed.details["reason"]
    assert failed.details["policy"] == policy


def test_a_second_runner_does_not_take_a_turn_that_is_held(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    job = scheduled(make_job, admin_actor, rounds=1)
    turn = job_advance(job_id=job.pk)
    Turn.objects.filter(pk=turn.pk).update(
        runner="someone-else", lease_expires_at=job.created_at.replace(year=2999)
    )
    assert turn_runner.run(turn.pk, runner="me").outcome == "not claimed"


def test_a_hospital_that_reported_no_split_sizes_fails_its_turn_saying_so(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    """Its frames could not be checked against its data (invariant 5): no turn is served."""
    job = scheduled(make_job, admin_actor, rounds=1, on_failure="fail")
    first = job.participants.get(position=0).hospital
    first.dataset_summary = {k: v for k, v in first.dataset_summary.items() if k != "split_sizes"}
    first.save(update_fields=["dataset_summary"])
    turn = job_advance(job_id=job.pk)
    assert turn_runner.run(turn.pk, runner="r").outcome == "failed"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert f"hospital {first.slug} has reported no split sizes" in turn.failure_reason


def test_a_job_in_a_mode_this_worker_was_not_configured_with_fails_saying_so(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    """A worker runs only the modes it was told of (MEDSPLIT["EXTRA_MODES"]): a job whose
    mode it does not know fails its turn naming the mode and the setting."""
    job = scheduled(make_job, admin_actor, rounds=1, on_failure="fail")
    turn = job_advance(job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(mode="elsewhere")  # known to another party only
    assert turn_runner.run(turn.pk, runner="r").outcome == "failed"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert "unknown mode 'elsewhere'" in turn.failure_reason
    assert 'MEDSPLIT["EXTRA_MODES"] (MEDSPLIT_EXTRA_MODES)' in turn.failure_reason


def test_a_job_naming_a_model_module_this_worker_does_not_list_fails_before_importing_it(
    runtime: str, make_job, admin_actor: Actor, tmp_path, monkeypatch
) -> None:
    """A worker imports only the model modules of its own MEDSPLIT["MODEL_MODULES"]: a
    job whose description names a factory in another one (a coordinator listing more, a
    row changed behind its back) fails its turn naming the module and the setting, and
    the module was never imported."""
    from tests.model_modules import ARGS, listed, marked_module
    from training.apps import MODEL_MODULES_SETTING

    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = scheduled(make_job, admin_actor, rounds=1, on_failure="fail")
    turn = job_advance(job_id=job.pk)
    described = {**job.description, "model": marked.factory, "model_args": ARGS}
    Job.objects.filter(pk=job.pk).update(description=described, model_name=marked.factory)
    with listed(["monai"], setting=MODEL_MODULES_SETTING):
        assert turn_runner.run(turn.pk, runner="r").outcome == "failed"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert f"ModelModuleRefused: model module {marked.module!r}" in turn.failure_reason
    assert 'add it to MEDSPLIT["MODEL_MODULES"] (MEDSPLIT_MODEL_MODULES)' in turn.failure_reason
    # The relay guard's sweep builds no such model either: the job's keys may hold only
    # their own cost here, and the sweep goes on for the other jobs.
    from workers.relay_watch import job_limits

    with listed(["monai"], setting=MODEL_MODULES_SETTING):
        assert job_limits(f"job-{job.pk}", turn.hospital.slug) is None
    assert not marked.imported()


def test_a_vertical_round_without_every_party_s_turn_fails_the_others_saying_why(
    runtime: str, make_job, admin_actor: Actor, three_hospitals
) -> None:
    """A vertical step needs every party's frame: a round whose other turn no longer runs
    (its agent gone, its turn ended) fails the running one with the reason, once, rather
    than serving half a round or being sent again forever."""
    from workers import group_runner

    job = scheduled(
        make_job,
        admin_actor,
        mode="vertical",
        cuts=["pool1", "pool"],
        mode_options={"min_records": 10},
        participants=[{"hospital": h.slug} for h in three_hospitals[:2]],
        on_failure="fail",
    )
    job_advance(job_id=job.pk)
    label, passive = Turn.objects.filter(job=job).order_by("position")
    assert label.status == passive.status == Turn.Status.RUNNING, "the round's turns start at once"
    Turn.objects.filter(pk=passive.pk).update(status=Turn.Status.FAILED)  # it ended elsewhere
    assert group_runner.run(label.pk, runner="r") == "failed"
    label.refresh_from_db()
    assert label.status == Turn.Status.FAILED
    assert "needs every party's turn at once" in label.failure_reason
    assert passive.hospital.slug in label.failure_reason


def test_a_vanilla_segmentation_job_takes_its_task_s_loss_at_the_worker_exactly(
    runtime: str, make_job, admin_actor: Actor, three_hospitals
) -> None:
    """In vanilla mode the masks travel and the worker computes the loss: the job's
    (Dice and cross-entropy, the segmentation default), bit for bit as unsplit training."""
    for hospital in three_hospitals[:2]:
        hospital.dataset_summary = {
            "image_shape": [1, 32, 32],
            "split_sizes": {"train": 32, "val": 8},
            "task": "segmentation",
            "masks": 40,
            "mask_classes": {"0": 40, "1": 40},
        }
        hospital.save(update_fields=["dataset_summary"])
    job = scheduled(
        make_job,
        admin_actor,
        model="unet",
        task="segmentation",
        cuts=["model.skip.submodule.down"],
        participants=[{"hospital": h.slug} for h in three_hospitals[:2]],
        rounds=1,
        max_steps_per_turn=2,
    )
    train, val = local_data(job, 32), local_data(job, 8)
    with deterministic():
        hospitals = Hospitals(job, runtime, train, val).start()
        assert drive(job) == ["completed"] * 2
        hospitals.join(30)
        assert_exact(hospitals)
    turns = Turn.objects.filter(job=job)
    assert all("val_dice" in t.metrics and "val_accuracy" not in t.metrics for t in turns)
