"""A completed job evaluated at every hospital through the split, with real processes:
the coordinator (a live server), the real Redis with a user per hospital, a Celery worker
and beat, and two agent processes on synthetic images, one of them with a local test set.

A U-shaped job completes; its final model is then scored on the first hospital's test set
through the split (its front and head at home, the server segment on the worker), in an
evaluation-only turn. The figures the coordinator serves equal, exactly, the whole model's
scores on that test set (the agent's final weights and the job's server checkpoint, put
together here); the second hospital reports "no test set"; nothing trained (the job's
server checkpoint and the agent's final weights are the same bytes after); the audit log
records the evaluation and its sizes, never a figure; a consortium admin's request
evaluates it again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEvent
from hospital_agent.data import DataSource
from hospital_agent.data.testset import load_test_for_job
from medsplit.protocol.handoff import import_parties
from medsplit.training.evaluate import majority_baseline, score
from medsplit.training.setup import client_parties, server_party
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.workers.agents import SAMPLES, SHAPE, Agents, consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, wait_until, workers_relay_user
from training.models import Evaluation, HospitalEvaluation, Job
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TEST_SAMPLES = 20


def evaluated(job: Job, attempt: int) -> bool:
    return Evaluation.objects.filter(
        job=job, attempt=attempt, status=Evaluation.Status.COMPLETED
    ).exists()


def test_a_completed_job_is_evaluated_at_each_hospital_through_the_split(
    processes: Processes,
    consortium: str,
    redis_url: str,
    tmp_path: Path,
    admin_actor,
    consortium_admin,
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(
        admin_actor, 2, own={0: {"MEDSPLIT_AGENT_DATA_TEST_SAMPLES": str(TEST_SAMPLES)}}
    )
    first, second = agents.hospitals
    for hospital in agents.hospitals:
        hospital.refresh_from_db()
    assert first.dataset_summary["split_sizes"]["test"] == TEST_SAMPLES
    assert sum(first.dataset_summary["test_label_counts"].values()) == TEST_SAMPLES
    assert "test" not in second.dataset_summary["split_sizes"]
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker-a")
        processes.celery_beat()
        job = small_job(
            admin_actor,
            agents.hospitals,
            mode="ushaped",
            cuts=["pool1", "pool"],
            max_steps_per_turn=3,
        )
        wait_completed(processes, job, agents, 120)
        wait_until("the evaluation to end", lambda: evaluated(job, 1), 60, processes)
        job.refresh_from_db()
        row = job.server_checkpoint
        server_bytes = read_verified(checkpoint_dir() / row.path, row.sha256)
        final_bytes = agents.final(job, 0).read_bytes()

        api = APIClient()
        api.force_login(consortium_admin)
        again = api.post(f"/api/jobs/{job.pk}/evaluate/")
        assert again.status_code == 202, again.json()
        assert again.json()["evaluation"]["attempt"] == 2
        wait_until("the second evaluation to end", lambda: evaluated(job, 2), 60, processes)

    parts = {p.hospital_id: p for p in HospitalEvaluation.objects.filter(evaluation__attempt=1)}
    assert parts[second.pk].status == "no_test_set"
    part = parts[first.pk]
    assert part.status == "completed", f"{part.failure_reason}\n{processes.logs()}"

    # The figures are the whole model's on the hospital's test set, exactly.
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    server, clients = server_party(split, config), client_parties(split, config)
    import_parties(server_bytes, {SERVER_PARTY: server})
    import_parties(final_bytes, clients)
    source = DataSource(kind="synthetic", samples=TEST_SAMPLES, seed=10 + 1, shape=SHAPE)
    test = load_test_for_job(
        source, input_shape=model.input_shape, num_classes=model.num_classes, task=config.task
    )
    want = score([clients["front"].module, server.module, clients["head"].module], test)
    served = api.get(f"/api/jobs/{job.pk}/results/").json()
    mine = {h["hospital"]: h for h in served["hospitals"]}[first.slug]
    assert mine["status"] == "completed" and mine["test_samples"] == TEST_SAMPLES
    assert mine["accuracy"] == want["val_accuracy"]
    assert mine["auc"] == want.get("val_auc")
    train = agents.trains(job)[0]
    assert mine["baseline_accuracy"] == majority_baseline(train.labels, test.labels).accuracy
    assert {h["hospital"]: h["status"] for h in served["hospitals"]}[second.slug] == "no_test_set"
    mean = served["weighted_mean"]
    assert (mean["hospitals"], mean["test_samples"]) == (1, TEST_SAMPLES)
    assert mean["accuracy"] == mine["accuracy"] and "not pooled" in mean["label"]
    assert served["evaluation"]["attempt"] == 2
    assert (
        HospitalEvaluation.objects.get(evaluation__attempt=2, hospital=first).metrics
        == part.metrics
    ), "the same model scored on the same test set again"

    # Nothing learnt: the job's server state and the hospital's final weights, unchanged.
    job.refresh_from_db()
    assert job.server_checkpoint.pk == row.pk
    assert hashlib.sha256(read_verified(checkpoint_dir() / row.path, row.sha256)).digest() == (
        hashlib.sha256(server_bytes).digest()
    )
    assert agents.final(job, 0).read_bytes() == final_bytes

    # The audit log: that it ran, and its sizes; no figure.
    started = AuditEvent.objects.filter(job_id=job.pk, action="evaluation.started").first()
    assert started.details["test_samples"] == {first.slug: TEST_SAMPLES}
    assert started.details["no_test_set"] == [second.slug]
    done = AuditEvent.objects.filter(job_id=job.pk, action="evaluation.hospital_completed")
    assert done.count() == 2
    for event in done:
        assert set(event.details) == {"attempt", "test_samples", "bytes_up", "bytes_down"}
        assert event.details["bytes_up"] > 0 and event.details["bytes_down"] > 0
    assert SAMPLES  # the agents' pools (tests/workers/agents.py)
