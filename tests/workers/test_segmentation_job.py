"""Segmentation through the platform, with real processes: the coordinator (a live
server), the real Redis with a user per hospital, a Celery worker and beat, and two agent
processes on MONAI's synthetic images with masks.

A UNet cut in its encoder and before its head, U-shaped: each hospital runs the encoder's
first block and the head with the loss (MONAI's ``DiceCELoss``) on its own masks; the
worker runs the rest, every skip tensor of the cut crossing. The job's result (every
agent's final weights and the job's server segment) equals, bit for bit
(``torch.equal``), unsplit training over the same batches; each turn reports its mean
Dice (``val_dice``), which the job API serves as the job's metric; no mask crossed (the
audit log lists what crossed, by name and dtype).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rest_framework.test import APIClient

from audit.models import AuditEvent
from hospital_agent.data import DataSource, load_local, prepare
from medsplit.data import DataSplit
from medsplit.protocol.handoff import import_parties
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import job_batches
from medsplit.training.setup import client_parties, server_party
from medsplit.training.verify import deterministic
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.workers.agents import Agents, consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, workers_relay_user
from training.models import Job, Turn
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHAPE = (1, 32, 32)
SAMPLES = 30
VAL_FRACTION = 0.2
#: What each agent reads: MONAI's discs with their masks, background and one class.
SEGMENTATION_DATA = {
    "MEDSPLIT_AGENT_DATA_TASK": "segmentation",
    "MEDSPLIT_AGENT_DATA_SHAPE": ",".join(map(str, SHAPE)),
    "MEDSPLIT_AGENT_DATA_NUM_CLASSES": "2",
    "MEDSPLIT_AGENT_DATA_SAMPLES": str(SAMPLES),
    "MEDSPLIT_AGENT_DATA_VAL_FRACTION": str(VAL_FRACTION),
}


def trains(job: Job, agents: Agents) -> list[DataSplit]:
    """Each hospital's training split, exactly as its agent reads and splits it."""
    model = job_model(job)
    splits = []
    for i in range(len(agents.hospitals)):
        source = DataSource(
            kind="synthetic",
            task="segmentation",
            samples=SAMPLES,
            num_classes=2,
            seed=10 + i,
            shape=SHAPE,
        )
        data, _ = load_local(
            source,
            input_shape=model.input_shape,
            num_classes=model.num_classes,
            val_fraction=VAL_FRACTION,
            seed=10 + i,
        )
        splits.append(
            prepare(data, input_shape=model.input_shape, num_classes=model.num_classes).train
        )
    return splits


def test_a_ushaped_unet_cut_in_its_encoder_equals_unsplit_training(
    processes: Processes,
    consortium: str,
    redis_url: str,
    tmp_path: Path,
    admin_actor,
    consortium_admin,
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 2, extra=SEGMENTATION_DATA)
    assert all(h.dataset_summary["task"] == "segmentation" for h in _fresh(agents))
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker-a")
        processes.celery_beat()
        job = small_job(
            admin_actor,
            agents.hospitals,
            model="unet",
            task="segmentation",
            mode="ushaped",
            cuts=["model.skip.submodule.down", "model.skip"],
            batch_size=8,
            max_steps_per_turn=3,
            client_optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
            server_optimizer={"name": "adam", "lr": 0.001},
        )
        wait_completed(processes, job, agents, 180)

    # Each turn validated on its hospital's masks and reported mean Dice.
    for turn in Turn.objects.filter(job=job):
        assert 0.0 <= turn.metrics["val_dice"] <= 1.0, turn.metrics
        assert "val_accuracy" not in turn.metrics
    api = APIClient()
    api.force_login(consortium_admin)
    served = api.get(f"/api/jobs/{job.pk}/").json()
    assert (served["task"], served["metric"]) == ("segmentation", "val_dice")

    # No mask crossed: what went up to the worker was activations and skips only.
    finished = AuditEvent.objects.filter(job_id=job.pk, action="turn.finished")
    assert finished.count() == 2
    for event in finished:
        up = event.details["crossed"]["up"]
        assert not any("labels" in tensors for tensors in up.values()), up

    # The result equals unsplit training over the same batches, bit for bit.
    job.refresh_from_db()
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    data = trains(job, agents)
    with deterministic():
        want = train_unsplit(
            model.build(), data, config, split, batches=list(job_batches(config, data))
        ).state_dict()
    server = server_party(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    for i in range(len(agents.hospitals)):
        clients = client_parties(split, config)
        import_parties(agents.final(job, i).read_bytes(), clients)
        got = dict(server.module.state_dict())
        for party in clients.values():
            got.update(party.module.state_dict())
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert torch.equal(got[name], value), f"agent {i}: {name} differs from unsplit training"


def _fresh(agents: Agents):
    for hospital in agents.hospitals:
        hospital.refresh_from_db()
    return agents.hospitals
