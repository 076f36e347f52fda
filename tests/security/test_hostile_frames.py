"""Invariant 5 against an attacker: every frame is checked before it is applied.

Server side: a hostile hospital (a real ``TurnClient`` whose frames are tampered with on
the way out) against the real worker (``workers.turn_runner.run``), the real database rows
and a real Redis. Each attack costs the hostile hospital its turn attempt, with a reason
naming it and the check; the server segment the job continues from stays as it was
(``torch.equal``); the hospital is told at once (``stopped``), and another hospital's
turn then completes.

Hospital side: a hostile server (a real ``TurnServer`` whose frames are tampered with)
against the real ``TurnClient`` over a real Redis: its frame is refused, nothing of it is
applied, and the agent reports the refusal to the coordinator.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import torch
from safetensors.torch import load as load_safetensors

from hospital_agent.turns import report_refusal
from hospitals.models import Hospital
from kernel.actors import Actor
from medsplit.channel import StreamPair
from medsplit.channel.redis import RedisChannel
from medsplit.data import synthetic_split
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.roles import LABELS, LOGITS
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel, cached_split, client_parties, server_party
from medsplit.turns import (
    ClientOutcome,
    Directive,
    MemoryCheckpointStore,
    MemorySnapshots,
    TurnClient,
    TurnIds,
    TurnProgress,
    TurnServer,
    control,
)
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from medsplit.wire import Frame, FrameKind
from tests.redis_server import forget_jobs, session_keys
from tests.workers.hospitals import Hospitals, local_data
from training import services
from training.models import Job, Turn
from training.runs import checkpoint_dir, checkpoints_of_place
from training.scheduling import job_advance
from training.states import JobState
from workers import turn_runner

STEPS = 3  # training steps of a turn (batch 16, the job's default)
HOSTILE = 1  # the hostile hospital's place in the turn order: an honest turn comes first
Tamper = Callable[[Frame], Frame]

platform = pytest.mark.django_db(transaction=True)


# -- a hostile hospital against the real worker ---------------------------------------------


class HostileClient(TurnClient):
    """Plays the protocol as an honest hospital would, but ``tamper`` changes what it sends."""

    def __init__(self, *, tamper: Tamper, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        honest = self.io.send  # every frame a side sends goes through its FrameIO
        self.io.send = lambda frame: honest(tamper(frame))  # type: ignore[method-assign]


def at(kind: FrameKind, step: int, change: Callable[[Frame], Frame]) -> Tamper:
    """Change the frame of ``kind`` at ``step``; send every other frame as it is."""

    def tamper(frame: Frame) -> Frame:
        if frame.meta.kind == kind and frame.meta.step == step:
            return change(frame)
        return frame

    return tamper


def with_tensors(frame: Frame, change: Callable[[str, torch.Tensor], torch.Tensor]) -> Frame:
    return Frame(frame.meta, {name: change(name, t) for name, t in frame.tensors.items()})


def with_metrics(values: Mapping[str, float]) -> Callable[[Frame], Frame]:
    def change(frame: Frame) -> Frame:
        tensors = dict(frame.tensors)
        tensors.update({k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()})
        return Frame(frame.meta, tensors)

    return change


@pytest.fixture
def runtime(settings, tmp_path, redis_url: str) -> Iterator[str]:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "CHECKPOINT_EVERY": 2,
        "TURN_SILENCE_SECONDS": 20.0,
        "TURN_LEASE_SECONDS": 5.0,
        "METRICS_MIN_INTERVAL_SECONDS": 0.0,
    }
    yield redis_url
    forget_jobs(redis_url, Job.objects.values_list("pk", flat=True))


@dataclass
class Attack:
    """A job whose second hospital is hostile, after its honest first turn."""

    job: Job
    hospitals: Hospitals
    slug: str
    server_before: dict[str, torch.Tensor]

    def hostile_turn(self) -> tuple[Turn, str]:
        """Serve the hostile hospital's turn with the real worker."""
        turn = job_advance(job_id=self.job.pk)
        assert turn is not None and turn.position == HOSTILE
        outcome = turn_runner.run(turn.pk, runner="security-test").outcome
        turn.refresh_from_db()
        return turn, outcome


def server_state(job: Job) -> dict[str, torch.Tensor]:
    """The server segment's state the job's next turn starts from (its kept checkpoint)."""
    job.refresh_from_db()
    row = job.server_checkpoint
    assert row is not None, "the honest first turn left a checkpoint"
    return load_safetensors(read_verified(checkpoint_dir() / row.path, row.sha256))


def attack(
    runtime: str,
    make_job,
    admin_actor: Actor,
    tamper: Tamper,
    *,
    on_failure: str = "retry",
    reported_train: int | None = None,
    go_on: bool = False,
) -> Attack:
    """Schedule a small job, let its first (honest) turn complete, and give the second
    hospital ``tamper``; ``reported_train`` makes it report fewer training samples than
    it holds."""
    job = make_job(
        seed=uuid.uuid4().int % 1000,  # stream names carry the job id: no stale frames
        rounds=1,
        max_steps_per_turn=STEPS,
        on_failure=on_failure,
        max_retries=1,
    )
    train, val = local_data(job, 16 * STEPS), local_data(job, 16)

    def client(**kwargs: Any) -> TurnClient:
        if kwargs["ids"].position == HOSTILE:
            return HostileClient(tamper=tamper, **kwargs)
        return TurnClient(**kwargs)

    hospitals = Hospitals(
        job, runtime, train, val, reply_timeout=20, client=client, go_on_when_stopped=go_on
    )
    slug = hospitals.slugs[HOSTILE]
    if reported_train is not None:
        hospital = Hospital.objects.get(slug=slug)
        hospital.dataset_summary["split_sizes"]["train"] = reported_train
        hospital.save(update_fields=["dataset_summary"])
    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    hospitals.start()
    first = job_advance(job_id=job.pk)
    assert turn_runner.run(first.pk, runner="security-test").outcome == "completed"
    return Attack(job, hospitals, slug, server_state(job))


def assert_refused(attack: Attack, turn: Turn, outcome: str, check: str, *, step: int) -> None:
    """The hostile hospital's attempt failed, naming it and the check; it was told so at
    once; the server state the job continues from is as before, bit for bit."""
    assert outcome == "failed"
    assert turn.status in (Turn.Status.FAILED, Turn.Status.SKIPPED)
    assert f"hospital {attack.slug}" in turn.failure_reason, turn.failure_reason
    assert f"failed the {check!r} check" in turn.failure_reason, turn.failure_reason
    if not attack.hospitals.go_on_when_stopped:
        with pytest.raises(Exception, match="was stopped"):
            attack.hospitals.join(10)  # told "stopped": no wait for its reply timeout
    assert attack.hospitals.reports[-1].outcome == ClientOutcome.STOPPED
    after = server_state(attack.job)
    assert after.keys() == attack.server_before.keys()
    for name, value in attack.server_before.items():
        assert torch.equal(after[name], value), f"{name} changed"
    # Checkpoints of the attempt hold honest steps only: none at or after the bad frame.
    kept = checkpoints_of_place(job_id=attack.job.pk, round_index=0, position=HOSTILE)
    assert all(c.step < step for c in kept), [c.step for c in kept]


@platform
def test_nan_activations_fail_only_the_sender_and_the_next_hospital_completes(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    nan = at(
        FrameKind.ACTIVATIONS,
        2,
        lambda f: with_tensors(f, lambda n, t: t if n == LABELS else torch.full_like(t, torch.nan)),
    )
    a = attack(runtime, make_job, admin_actor, nan, on_failure="skip", go_on=True)
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "finite", step=2)
    assert turn.status == Turn.Status.SKIPPED, "the job's policy: skip the hospital"
    kept = checkpoints_of_place(job_id=a.job.pk, round_index=0, position=HOSTILE)
    assert [c.step for c in kept] == [1], "the honest steps before the bad frame are kept"
    following = job_advance(job_id=a.job.pk)
    assert following is not None and following.position == HOSTILE + 1
    assert turn_runner.run(following.pk, runner="security-test").outcome == "completed"
    a.hospitals.join(20)
    following.refresh_from_db()
    assert following.status == Turn.Status.COMPLETED and following.steps == STEPS
    final = server_state(a.job)
    assert all(torch.isfinite(t).all() for t in final.values() if t.is_floating_point())


@platform
def test_labels_out_of_range_fail_the_turn_and_the_retry_limit_applies(
    runtime: str, make_job, admin_actor: Actor
) -> None:
    def seven(frame: Frame) -> Frame:
        return with_tensors(frame, lambda n, t: t.clone().fill_(7) if n == LABELS else t)

    a = attack(runtime, make_job, admin_actor, at(FrameKind.ACTIVATIONS, 1, seven))
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "labels in range", step=1)
    assert turn.status == Turn.Status.FAILED
    retry = Turn.objects.get(job=a.job, position=HOSTILE, attempt=2)
    assert retry.status == Turn.Status.PENDING, "the job's policy decides: one retry"


@platform
def test_a_batch_larger_than_the_jobs_is_refused(runtime: str, make_job, admin_actor) -> None:
    """One sample too many: within the relay's bound on frame sizes (a batch of 4,096 in
    this job is refused earlier, as an oversized frame: tests/security/test_relay_memory.py),
    so the batch check is what stops it."""

    def one_more(frame: Frame) -> Frame:
        return with_tensors(frame, lambda n, t: torch.cat([t, t[:1]]))  # 17 samples, job's 16

    a = attack(runtime, make_job, admin_actor, at(FrameKind.ACTIVATIONS, 1, one_more))
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "batch size", step=1)
    assert "a batch of 17 samples" in turn.failure_reason


@platform
def test_a_step_past_the_turns_limit_is_refused(runtime: str, make_job, admin_actor) -> None:
    """The hospital reported 32 training samples (2 steps of 16) but sends a third step."""
    a = attack(runtime, make_job, admin_actor, lambda f: f, reported_train=32)
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "step limit", step=2)
    assert "step 2 is past the turn's 2 training steps" in turn.failure_reason


@platform
def test_metrics_at_step_zero_do_not_complete_a_turn(runtime: str, make_job, admin_actor) -> None:
    def done_already(frame: Frame) -> Frame:
        claims = {"train_loss": 0.01, "val_loss": 0.01, "val_accuracy": 1.0, "val_samples": 16.0}
        return control.metrics(control_ids(frame), frame.meta.step, claims)

    a = attack(runtime, make_job, admin_actor, at(FrameKind.ACTIVATIONS, 0, done_already))
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "step limit", step=0)
    assert turn.metrics == {} and turn.steps == 0


def control_ids(frame: Frame) -> TurnIds:
    m = frame.meta
    return TurnIds(m.job, m.round, m.position, m.mode, m.codec)


@platform
@pytest.mark.parametrize(
    "claims",
    [{"val_samples": 10_000.0}, {"val_accuracy": 1.5}, {"val_loss": float("nan")}],
    ids=["more-samples-than-reported", "accuracy-above-one", "non-finite-loss"],
)
def test_metrics_that_cannot_be_true_are_refused(
    runtime: str, make_job, admin_actor: Actor, claims: dict[str, float]
) -> None:
    final = STEPS + 1  # three training steps and one validation batch
    a = attack(runtime, make_job, admin_actor, at(FrameKind.METRICS, final, with_metrics(claims)))
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "metrics", step=final)
    assert next(iter(claims)) in turn.failure_reason
    assert turn.metrics == {}, "nothing of the metrics was recorded"


@platform
@pytest.mark.parametrize(
    "change",
    [
        # The same size as the cut's float32 (a wider dtype makes an oversized frame,
        # refused before decoding: tests/security/test_relay_memory.py).
        lambda n, t: t if n == LABELS else t.to(torch.int32),
        lambda n, t: t if n == LABELS else t.half(),
        lambda n, t: t if n == LABELS else t[:, :, :-1],
    ],
    ids=["int32", "float16", "one-row-short"],
)
def test_activations_of_another_dtype_or_shape_are_refused(
    runtime: str, make_job, admin_actor: Actor, change
) -> None:
    tamper = at(FrameKind.ACTIVATIONS, 1, lambda f: with_tensors(f, change))
    a = attack(runtime, make_job, admin_actor, tamper)
    turn, outcome = a.hostile_turn()
    assert_refused(a, turn, outcome, "shape", step=1)


# -- a hostile server against the real hospital ---------------------------------------------


class HostileServer(TurnServer):
    """Serves the turn as an honest worker would, but ``tamper`` changes what it sends."""

    def __init__(self, *, tamper: Tamper, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tamper = tamper

    def _send(self, frame: Frame) -> None:
        super()._send(self.tamper(frame))


class StopWhenSet:
    """The coordinator's side: run until ``stop`` is set."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def directive(self) -> Directive:
        return Directive.STOP if self.stop.is_set() else Directive.RUN

    def progress(self, progress: TurnProgress) -> None:
        pass

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


class RecordingCoordinator:
    """The coordinator as the agent calls it: records the problems reported."""

    def __init__(self) -> None:
        self.problems: list[dict[str, Any]] = []

    def report_problem(self, *, job: int, turn: int, reason: str) -> dict[str, Any]:
        self.problems.append({"job": job, "turn": turn, "reason": reason})
        return {}


@pytest.fixture
def relay(redis_url: str) -> Iterator[tuple[str, StreamPair]]:
    job = f"job-sec{uuid.uuid4().hex[:8]}"
    streams = session_keys().streams(job, "general")
    yield job, streams
    client = redis.Redis.from_url(redis_url)
    client.delete(*(k for s in (streams.up, streams.down) for k in (s, f"{s}:seq")))
    client.close()


def hospital_against(
    redis_url: str, relay: tuple[str, StreamPair], tamper: Tamper
) -> tuple[TurnClient, pytest.ExceptionInfo[FrameRejected]]:
    """The real TurnClient's turn against a hostile server; returns the refusal."""
    job, streams = relay
    config = TrainingConfig(cuts=("pool1",), batch_size=16, max_steps_per_turn=STEPS, job=job)
    model = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), seed=5)
    split = cached_split(model, config.cuts)
    ids = TurnIds(job, 0, 0, config.mode, config.codec)
    train = synthetic_split(16 * STEPS, shape=(1, 28, 28), num_classes=2, seed=1)
    val = synthetic_split(16, shape=(1, 28, 28), num_classes=2, seed=2)
    hooks = StopWhenSet()
    server = HostileServer(
        tamper=tamper,
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        party=server_party(split, config),
        store=MemoryCheckpointStore(export_parties({SERVER_PARTY: server_party(split, config)})),
        hooks=hooks,
        limits=turn_limits(config, num_classes=2, train=len(train), val=len(val)),
        checkpoint_every=1,  # the hospital snapshots before every step
        poll_interval=0.05,
        silence_timeout=10,
    )
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    client = TurnClient(
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        parties=lambda: client_parties(split, config),
        start=export_parties(client_parties(split, config)),
        config=config,
        train=train,
        val=val,
        snapshots=MemorySnapshots(),
        reply_timeout=10,
        limits=turn_limits(config, num_classes=2, train=len(train), val=len(val)),
    )
    try:
        with pytest.raises(FrameRejected) as refused:
            client.run()
    finally:
        hooks.stop.set()
        serving.join(10)
        client.channel.close()
        server.channel.close()
    return client, refused


def assert_nothing_applied(client: TurnClient, step: int) -> None:
    """The hospital's parties are as its snapshot before ``step`` left them, and it kept
    no snapshot after it."""
    assert max(client.snapshots.steps()) == step
    before = load_safetensors(client.snapshots.load(step))
    now = load_safetensors(client.state())
    assert now.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(now[name], value), f"{name} changed"


def assert_reported(refusal: FrameRejected, check: str) -> None:
    """The agent tells the coordinator, which fails the turn attempt with this reason."""
    coordinator = RecordingCoordinator()
    report_refusal(coordinator, job=7, turn_id=3, refusal=refusal)  # type: ignore[arg-type]
    (problem,) = coordinator.problems
    assert problem["turn"] == 3
    assert "the server's" in problem["reason"] and f"the {check!r} check" in problem["reason"]


def test_nan_gradients_from_a_hostile_server_are_refused_and_not_applied(
    redis_url: str, relay: tuple[str, StreamPair]
) -> None:
    def nan(frame: Frame) -> Frame:
        return with_tensors(frame, lambda n, t: t if n == "loss" else torch.full_like(t, torch.nan))

    client, refused = hospital_against(redis_url, relay, at(FrameKind.GRADIENTS, 1, nan))
    assert refused.value.check == "finite"
    assert "the server's gradients frame for step 1" in str(refused.value)
    assert_nothing_applied(client, 1)
    assert_reported(refused.value, "finite")


@pytest.mark.parametrize(
    ("kind", "change", "check"),
    [
        (FrameKind.GRADIENTS, lambda n, t: t if n == "loss" else t[:, :, :-1], "shape"),
        (FrameKind.GRADIENTS, lambda n, t: t if n == "loss" else t.double(), "shape"),
        (FrameKind.GRADIENTS, lambda n, t: t if n == "loss" else t[:-1], "batch size"),
        (FrameKind.EVAL_OUTPUTS, lambda n, t: torch.zeros(t.shape[0], 5), "shape"),
    ],
    ids=[
        "gradients-one-row-short",
        "gradients-float64",
        "gradients-of-fewer-samples",
        "logits-of-5-classes",
    ],
)
def test_gradients_or_logits_of_the_wrong_shape_are_refused_and_not_applied(
    redis_url: str, relay: tuple[str, StreamPair], kind: FrameKind, change, check: str
) -> None:
    step = 1 if kind == FrameKind.GRADIENTS else STEPS  # the first validation batch
    tamper = at(kind, step, lambda f: with_tensors(f, change))
    client, refused = hospital_against(redis_url, relay, tamper)
    assert refused.value.check == check, refused.value
    assert f"the server's {kind} frame for step {step}" in str(refused.value)
    assert_nothing_applied(client, min(step, STEPS))
    assert_reported(refused.value, check)
    if kind == FrameKind.EVAL_OUTPUTS:
        assert LOGITS in str(refused.value) and "(B, 2)" in str(refused.value)
