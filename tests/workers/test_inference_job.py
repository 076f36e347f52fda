"""Predictions through the split with real processes: the coordinator (a live server),
the real Redis with a user per hospital and one for the workers, a Celery worker that
consumes an inference queue of its own, beat, and two agent processes; then
``medsplit-agent predict`` as a process of its own at the first hospital.

A U-shaped job completes (the head stays at the hospital); the agent predicts on PNG
files. The CSV's predictions are the whole model's (the agent's final weights and the
job's server checkpoint put together here, on the same serving batches); the audit log
records the request and its sizes; an unreadable image is one error line, a nonzero exit
and nothing written; nothing trained (the job's server checkpoint is the same bytes).
"""

from __future__ import annotations

import csv
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from audit.models import AuditEvent
from hospital_agent.data.transforms import load_for_prediction
from medsplit.protocol.handoff import import_parties
from medsplit.training.setup import client_parties, server_party
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests import zygote
from tests.workers.agents import Agents, open_consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, workers_relay_user
from training.models import InferenceRequest
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

IMAGES = 20
SERVING_BATCH = 8


@pytest.fixture
def consortium(live_server, settings, redis_url: str) -> str:
    return open_consortium(live_server, settings, redis_url, INFERENCE_BATCH_SIZE=SERVING_BATCH)


def pngs(folder: Path, count: int) -> list[str]:
    folder.mkdir()
    rng = np.random.default_rng(4)
    paths = []
    for i in range(count):
        path = folder / f"scan-{i}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def predict(env: dict[str, str], job: int, paths: list[str], out: Path):
    command = [sys.executable, "-m", "hospital_agent", "predict", "--job", str(job)]
    return zygote.run([*command, "--out", str(out), *paths], env=env, timeout=180)


def test_an_agent_predicts_through_the_split_as_the_whole_model_does(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 2)
    queue = f"inference.test-{uuid.uuid4().hex[:8]}"
    processes.env["MEDSPLIT_CELERY_INFERENCE_QUEUE"] = queue
    paths = pngs(tmp_path / "scans", IMAGES)
    with workers_relay_user(redis_url, processes):
        processes.env["MEDSPLIT_INFERENCE_BATCH_SIZE"] = str(SERVING_BATCH)
        processes.celery_worker(
            "worker-a", queues=f"{processes.env['MEDSPLIT_CELERY_QUEUE']},{queue}"
        )
        processes.celery_beat()
        job = small_job(
            admin_actor,
            agents.hospitals,
            mode="ushaped",
            cuts=["pool1", "pool"],
            max_steps_per_turn=3,
        )
        wait_completed(processes, job, agents, 120)
        job.refresh_from_db()
        row = job.server_checkpoint
        server_bytes = read_verified(checkpoint_dir() / row.path, row.sha256)

        env = agents.env["agent-0"]
        out = tmp_path / "out" / "predictions.csv"
        bad = tmp_path / "broken.png"
        bad.write_bytes(b"not a png")
        refused = predict(env, job.pk, [*paths[:3], str(bad)], out)
        assert refused.returncode != 0
        # One error line (beside whatever MONAI logs of its own plugins), naming the file.
        lines = [x for x in refused.stderr.splitlines() if x.startswith("medsplit-agent")]
        assert len(lines) == 1 and str(bad) in lines[0], refused.stderr
        assert "predict" not in refused.stdout
        assert not out.exists() and InferenceRequest.objects.count() == 0

        done = predict(env, job.pk, paths, out)
        assert done.returncode == 0, f"{done.stderr}\n{processes.logs()}"
    assert f"{IMAGES} predictions written" in done.stdout

    # The whole model, from the hospital's final weights and the job's server checkpoint.
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    server, clients = server_party(split, config), client_parties(split, config)
    import_parties(server_bytes, {SERVER_PARTY: server})
    import_parties(agents.final(job, 0).read_bytes(), clients)
    images = load_for_prediction(paths, input_shape=tuple(model.input_shape))
    segments = [clients["front"].module, server.module, clients["head"].module]
    for segment in segments:
        segment.eval()
    with torch.no_grad():
        logits = []
        for batch in images.split(SERVING_BATCH):
            a = clients["front"].module(batch)
            logits.append(clients["head"].module(**server.module(**a)))
    probabilities = torch.softmax(torch.cat(logits).to(torch.float64), dim=1)
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["path"] for r in rows] == paths
    assert [int(r["predicted"]) for r in rows] == probabilities.argmax(1).tolist()
    for r, p in zip(rows, probabilities.tolist(), strict=True):
        assert [r["p_0"], r["p_1"]] == [f"{v:.6f}" for v in p]

    request = InferenceRequest.objects.get()
    assert request.status == "completed" and request.batches_served == 3
    assert request.samples == IMAGES and request.serving_batch == SERVING_BATCH
    served = AuditEvent.objects.get(action="inference.served")
    assert served.details["bytes_up"] > 0 and served.details["bytes_down"] > 0
    job.refresh_from_db()
    assert job.server_checkpoint.pk == row.pk, "nothing trained"
