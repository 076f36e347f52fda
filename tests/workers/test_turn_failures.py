"""Turns that fail must fail, once: every exception in a turn ends under the job's policy,
an infrastructure failure runs the same attempt again after a delay, and no turn is
started more often than its cap. The real turn runner, database and Redis; the failure
is raised inside the server's run, where the real ones happen."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from django.db import OperationalError

from audit.models import AuditEvent
from kernel.actors import Actor
from medsplit.turns import TurnServer
from tests.redis_server import forget_jobs
from training import services
from training.models import Job, Turn
from training.scheduling import job_advance
from training.states import JobState
from workers import turn_runner
from workers.failures import FailureKind, backoff, classify, max_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(settings, tmp_path, redis_url: str) -> Iterator[str]:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "TURN_LEASE_SECONDS": 5.0,
    }
    yield redis_url
    forget_jobs(redis_url, Job.objects.values_list("pk", flat=True))


def _running_turn(make_job, admin_actor: Actor, **overrides) -> Turn:
    job = make_job(seed=uuid.uuid4().int % 1000, **overrides)
    for participant in job.participants.select_related("hospital"):
        hospital = participant.hospital
        hospital.dataset_summary = {"split_sizes": {"train": 64, "val": 16}}
        hospital.save(update_fields=["dataset_summary"])
    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    turn = job_advance(job_id=job.pk)
    assert turn is not None
    return turn


def _raising(monkeypatch, error: BaseException) -> None:
    def run(self: TurnServer) -> object:
        raise error

    monkeypatch.setattr(TurnServer, "run", run)


def test_an_unexpected_exception_ends_the_attempt_under_the_jobs_policy(
    runtime: str, make_job, admin_actor: Actor, monkeypatch
) -> None:
    """Before: only MedSplitError was caught, so an out-of-memory error (or a bug) left the
    turn running, the sweep sent it again, forever, and the job's retries never applied."""
    turn = _running_turn(make_job, admin_actor, on_failure="retry", max_retries=1)
    _raising(monkeypatch, RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    result = turn_runner.run(turn.pk, runner="test")
    assert (result.outcome, result.advance, result.retry_in) == ("failed", True, None)
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert turn.failure_reason.startswith("RuntimeError: CUDA out of memory")
    retry = Turn.objects.get(job_id=turn.job_id, position=turn.position, attempt=2)
    assert retry.status == Turn.Status.PENDING, "the job's policy: one retry"


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("server closed the connection unexpectedly"),
        redis.ConnectionError("Connection reset by peer"),
    ],
    ids=["database", "relay"],
)
def test_an_infrastructure_failure_runs_the_same_attempt_again_later(
    runtime: str, make_job, admin_actor: Actor, monkeypatch, error: Exception
) -> None:
    turn = _running_turn(make_job, admin_actor)
    _raising(monkeypatch, error)
    result = turn_runner.run(turn.pk, runner="test")
    assert result.outcome == "retry" and result.retry_in == backoff(1) and not result.advance
    turn.refresh_from_db()
    assert turn.status == Turn.Status.RUNNING and turn.attempt == 1 and not turn.runner
    event = AuditEvent.objects.get(action="turn.run_interrupted", target=f"turn:{turn.pk}")
    assert type(error).__name__ in event.details["reason"]


def test_past_its_cap_an_attempt_fails_saying_so(
    runtime: str, make_job, admin_actor: Actor, monkeypatch, settings
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "TURN_MAX_RUNS": 3}
    turn = _running_turn(make_job, admin_actor, on_failure="fail")
    _raising(monkeypatch, redis.ConnectionError("Connection refused"))
    outcomes = [turn_runner.run(turn.pk, runner="test").outcome for _ in range(4)]
    assert outcomes == ["retry", "retry", "retry", "failed"]
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED and turn.runs == 4
    assert "started 4 times without finishing, more than the 3 allowed" in turn.failure_reason
    assert "the last failure: ConnectionError: Connection refused" in turn.failure_reason
    job = Job.objects.get(pk=turn.job_id)
    assert job.state == JobState.FAILED, "the job's policy: fail"


def test_failures_are_classified_by_whose_fault_they_are() -> None:
    from medsplit.errors import ChannelError, ChannelTimeout, RelayAbuse
    from medsplit.protocol.checks import FrameRejected
    from medsplit.turns import FrameRefused, HospitalSilent

    assert classify(ChannelError("Connection refused")) == FailureKind.INFRASTRUCTURE
    assert classify(ChannelTimeout("no frame")) == FailureKind.ATTEMPT
    assert classify(RelayAbuse("too big")) == FailureKind.ATTEMPT
    assert classify(HospitalSilent("silent")) == FailureKind.ATTEMPT
    assert classify(FrameRefused(FrameRejected("finite", "NaN"))) == FailureKind.ATTEMPT
    assert classify(IndexError("Target 7 is out of bounds")) == FailureKind.ATTEMPT
    assert max_runs(2) == 4
    assert [backoff(n) for n in (1, 2, 3, 10)] == [2.0, 4.0, 8.0, 120.0]
