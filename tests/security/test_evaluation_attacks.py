"""Attacks on the evaluation of a completed job's final model (training/evaluation.py,
workers/evaluation_runner.py, medsplit/turns/evaluation.py).

A hostile hospital (a real evaluation client whose frames are tampered with on the way
out) against the real worker, the real database rows and a real Redis: test batches of
the wrong shape or with non-finite values, a training frame (with labels out of range)
slipped into an evaluation, and metrics that cannot be true are refused, naming the
hospital and the check; nothing is recorded of its figures and nothing of the job's
server state changes (``torch.equal``; the evaluation writes no checkpoint). Through the
API: a hospital sees only its own figures and the weighted means, cannot end another
hospital's evaluation, and nobody can evaluate a job that has not completed.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch
from django.utils import timezone

from hospitals.relay_acl import relay_keys
from kernel.actors import Actor
from kernel.errors import InvalidInput
from medsplit.channel.redis import RedisChannel
from medsplit.data import synthetic_split
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.roles import LABELS
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import ClientOutcome, TurnIds, control
from medsplit.turns.evaluation import evaluation_client
from medsplit.wire import Frame, FrameKind
from tests.redis_server import forget_jobs
from training.evaluation import evaluation_finish, evaluation_start
from training.models import Evaluation, HospitalEvaluation, Job, ServerCheckpoint
from training.states import JobState
from workers import evaluation_runner
from workers.turn_runner import job_model

TEST = 16  # each hospital's test set: one batch of the job's 16
Tamper = Callable[[Frame], Frame]
platform = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(settings, tmp_path, redis_url: str) -> Iterator[str]:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "TURN_SILENCE_SECONDS": 20.0,
        "TURN_LEASE_SECONDS": 5.0,
    }
    yield redis_url
    forget_jobs(redis_url, Job.objects.values_list("pk", flat=True))


def completed(make_job, *, test: dict[int, int] | None = None, **overrides) -> Job:
    """A completed job whose hospitals reported test sets (``test``: position to size)."""
    job = make_job(state="completed", rounds=1, seed=uuid.uuid4().int % 1000, **overrides)
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now())
    sizes = {0: TEST, 1: TEST} if test is None else test
    for participant in job.participants.select_related("hospital"):
        hospital = participant.hospital
        summary = dict(hospital.dataset_summary)
        split_sizes = {**summary["split_sizes"]}
        if sizes.get(participant.position):
            split_sizes["test"] = sizes[participant.position]
        hospital.dataset_summary = {**summary, "split_sizes": split_sizes}
        hospital.save(update_fields=["dataset_summary"])
    return job


def at(kind: FrameKind, change: Callable[[Frame], Frame]) -> Tamper:
    return lambda frame: change(frame) if frame.meta.kind == kind else frame


def evaluate_at(job: Job, part: HospitalEvaluation, redis_url: str, tamper: Tamper | None):
    """The hospital's side in a thread (hostile with ``tamper``) and the real worker's.

    Returns:
        The worker's outcome, and how the hospital's side ended.
    """
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    final = export_parties(client_parties(split, config))
    kwargs = dict(
        ids=TurnIds(
            config.job, job.rounds + part.evaluation.attempt - 1, part.position, config.mode
        ),
        channel=RedisChannel(redis_url),
        streams=relay_keys().streams(config.job, part.hospital.slug),
        split=split,
        parties=lambda: client_parties(split, config),
        final_state=final,
        config=config,
        test=synthetic_split(TEST, shape=model.input_shape, seed=9),
        train_labels=torch.tensor([0, 1, 1]),
        num_classes=2,
        reply_timeout=20,
    )
    client = evaluation_client(**kwargs)
    if tamper is not None:  # plays the evaluation honestly, but changes what it sends
        honest = client.io.send
        client.io.send = lambda frame: honest(tamper(frame))  # type: ignore[method-assign]
    reports: list = []

    def hospital() -> None:
        try:
            reports.append(client.run())
        except Exception as e:  # the hostile side may be refused itself
            reports.append(e)

    thread = threading.Thread(target=hospital, daemon=True)
    thread.start()
    outcome = evaluation_runner.run(part.pk, runner="security-test").outcome
    thread.join(20)
    client.channel.close()
    return outcome, reports


def start(job: Job) -> Evaluation:
    return evaluation_start(job=job, actor=Actor.system())


def the_part(evaluation: Evaluation, position: int) -> HospitalEvaluation:
    return evaluation.parts.select_related("hospital", "evaluation", "job").get(position=position)


@platform
def test_an_honest_hospital_is_scored_and_the_server_state_is_not_written(
    runtime: str, make_job
) -> None:
    job = completed(make_job)
    evaluation = start(job)
    part = the_part(evaluation, 0)
    before = ServerCheckpoint.objects.count()
    outcome, reports = evaluate_at(job, part, runtime, None)
    assert outcome == "completed" and reports[0].outcome == ClientOutcome.COMPLETED
    part.refresh_from_db()
    assert part.status == "completed" and part.metrics["samples"] == TEST
    assert set(part.metrics) == {"accuracy", "auc", "baseline_accuracy", "samples"}
    assert ServerCheckpoint.objects.count() == before, "an evaluation saves no checkpoint"


def nan(frame: Frame) -> Frame:
    return Frame(frame.meta, {n: torch.full_like(t, torch.nan) for n, t in frame.tensors.items()})


def short(frame: Frame) -> Frame:
    return Frame(frame.meta, {n: t[..., :-1] for n, t in frame.tensors.items()})


def training_step(frame: Frame) -> Frame:
    """A training frame in place of the test batch, its labels out of range."""
    tensors = dict(frame.tensors)
    tensors[LABELS] = torch.full((next(iter(tensors.values())).shape[0],), 7)
    return Frame(dataclasses.replace(frame.meta, kind=FrameKind.ACTIVATIONS), tensors)


def metrics(values: dict[str, float]) -> Callable[[Frame], Frame]:
    def change(frame: Frame) -> Frame:
        m = frame.meta
        ids = TurnIds(m.job, m.round, m.position, m.mode, m.codec)
        claimed = {k: float(v) for k, v in frame.tensors.items()} | values
        return control.metrics(ids, m.step, claimed)

    return change


@platform
@pytest.mark.parametrize(
    ("tamper", "check"),
    [
        (at(FrameKind.EVAL_ACTIVATIONS, nan), "'finite'"),
        (at(FrameKind.EVAL_ACTIVATIONS, short), "'shape'"),
        (at(FrameKind.EVAL_ACTIVATIONS, training_step), "'step limit'"),
        (at(FrameKind.METRICS, metrics({"val_accuracy": 1.5})), "'metrics'"),
        (at(FrameKind.METRICS, metrics({"val_baseline_accuracy": -0.1})), "'metrics'"),
        (at(FrameKind.METRICS, metrics({"val_samples": 10_000.0})), "'metrics'"),
        (at(FrameKind.METRICS, metrics({"val_samples": 8.0})), "reported a test set of 16"),
    ],
    ids=[
        "non-finite-batch",
        "wrong-shape",
        "training-frame-labels-out-of-range",
        "accuracy-above-one",
        "negative-baseline",
        "more-samples-than-reported",
        "fewer-samples-than-reported",
    ],
)
def test_a_hostile_hospitals_evaluation_fails_and_nothing_of_it_is_kept(
    runtime: str, make_job, tamper: Tamper, check: str
) -> None:
    job = completed(make_job)
    evaluation = start(job)
    part = the_part(evaluation, 1)
    config = job.training_config()
    split = job_model(job).split(config)
    fresh = server_party(split, config).module.state_dict()
    outcome, _ = evaluate_at(job, part, runtime, tamper)
    assert outcome == "failed"
    part.refresh_from_db()
    assert part.status == "failed" and part.metrics == {}
    assert check in part.failure_reason, part.failure_reason
    if check.startswith("'"):  # a frame's check names the sender
        assert f"hospital {part.hospital.slug}" in part.failure_reason
    # The job's server state: still the (unwritten) initial one, nothing saved.
    job.refresh_from_db()
    assert job.server_checkpoint is None and not ServerCheckpoint.objects.filter(job=job).exists()
    again = server_party(split, config).module.state_dict()
    assert all(torch.equal(fresh[k], again[k]) for k in fresh)


@platform
def test_figures_are_checked_at_the_coordinator_too(make_job) -> None:
    job = completed(make_job)
    part = the_part(start(job), 0)
    for bad in ({"accuracy": float("nan"), "samples": TEST}, {"dice": 0.5, "samples": TEST}):
        with pytest.raises(InvalidInput, match=r"finite|reports"):
            evaluation_finish(part=part, metrics=bad)
    part.refresh_from_db()
    assert part.status == "running" and part.metrics == {}


# -- through the API ----------------------------------------------------------------------


def finished_evaluation(make_job) -> tuple[Job, list[HospitalEvaluation]]:
    job = completed(make_job, test={0: 40, 1: 60})
    evaluation = start(job)
    parts = [the_part(evaluation, i) for i in range(3)]
    evaluation_finish(part=parts[0], metrics={"accuracy": 0.75, "auc": 0.8125, "samples": 40})
    evaluation_finish(
        part=parts[1],
        metrics={"accuracy": 0.6125, "auc": 0.6875, "baseline_accuracy": 0.5, "samples": 60},
    )
    return job, parts


@platform
def test_a_hospital_admin_sees_their_own_figures_and_the_weighted_means_only(
    make_job, client_for, hospital_admin, consortium_admin
) -> None:
    job, parts = finished_evaluation(make_job)
    own = client_for(hospital_admin).get(f"/api/jobs/{job.pk}/results/")
    assert own.status_code == 200
    body = own.json()
    by_slug = {h["hospital"]: h for h in body["hospitals"]}
    mine, theirs = by_slug[parts[0].hospital.slug], by_slug[parts[1].hospital.slug]
    assert mine["accuracy"] == 0.75 and mine["test_samples"] == 40
    assert set(theirs) == {"hospital", "name", "position", "status"}
    assert by_slug[parts[2].hospital.slug]["status"] == "no_test_set"
    assert "0.6125" not in own.content.decode() and "0.6875" not in own.content.decode()
    mean = body["weighted_mean"]
    assert mean["accuracy"] == (40 * 0.75 + 60 * 0.6125) / 100
    assert mean["auc"] == (40 * 0.8125 + 60 * 0.6875) / 100 and "not pooled" in mean["label"]
    assert "test_samples" not in mean and "without" not in mean
    full = client_for(consortium_admin).get(f"/api/jobs/{job.pk}/results/").json()
    assert full["weighted_mean"]["test_samples"] == 100
    assert full["weighted_mean"]["without"] == {"baseline_accuracy": [parts[0].hospital.slug]}
    assert {h["hospital"]: h["accuracy"] for h in full["hospitals"][:2]} == {
        parts[0].hospital.slug: 0.75,
        parts[1].hospital.slug: 0.6125,
    }


@platform
def test_only_a_consortium_admin_evaluates_and_only_a_completed_job(
    make_job, client_for, hospital_admin, consortium_admin, agent_client
) -> None:
    job, parts = finished_evaluation(make_job)
    assert client_for(hospital_admin).post(f"/api/jobs/{job.pk}/evaluate/").status_code == 403
    agent = agent_client(parts[0].hospital)
    assert agent.get(f"/api/jobs/{job.pk}/results/").status_code == 403
    admin = client_for(consortium_admin)
    running = make_job(state="running")
    refused = admin.post(f"/api/jobs/{running.pk}/evaluate/")
    assert refused.status_code == 409 and "only a completed job" in refused.json()["message"]
    assert not Evaluation.objects.filter(job=running).exists()
    again = admin.post(f"/api/jobs/{job.pk}/evaluate/")
    assert again.status_code == 202 and again.json()["evaluation"]["attempt"] == 2
    busy = admin.post(f"/api/jobs/{job.pk}/evaluate/")
    assert busy.status_code == 409 and "still running" in busy.json()["message"]
    Job.objects.filter(pk=running.pk).update(state=JobState.COMPLETED)


@platform
def test_a_hospital_cannot_end_another_hospitals_evaluation(make_job, agent_client) -> None:
    job = completed(make_job)
    evaluation = start(job)
    a, b = the_part(evaluation, 0), the_part(evaluation, 1)
    url = f"/api/agent/assignments/{job.pk}/evaluation-problems/"
    body = {"evaluation": a.pk, "reason": "no test set", "no_test_set": True}
    assert agent_client(b.hospital).post(url, body, format="json").status_code == 404
    a.refresh_from_db()
    assert a.status == "running"
    # Its own: ended with the reason; a second report finds it ended.
    own = agent_client(a.hospital)
    assert own.post(url, body, format="json").json()["status"] == "no_test_set"
    assert own.post(url, body, format="json").status_code == 409


@platform
def test_assignments_carry_only_the_agents_own_evaluation(make_job, agent_client) -> None:
    job = completed(make_job)
    evaluation = start(job)
    for position in (0, 1):
        part = the_part(evaluation, position)
        got = agent_client(part.hospital).get(f"/api/agent/assignments/{job.pk}/").json()
        assert got["evaluation"]["id"] == part.pk and got["evaluation"]["round"] == job.rounds
