"""Vertical split learning through the platform, with real processes: the coordinator (a
live server), the real Redis with a user per hospital, a Celery worker and beat, and two
agent processes holding different data about the same patients: a lab's table of
numeric values with the diagnoses (the label party, running the job's ``tabular_mlp``)
and an imaging site's X-rays (running a model of its own, ``small_cnn``, named in the
job's ``party_models``).

The agents align their records by private set intersection over the relay (the label
party, the first participant, as the client), the coordinator compares their digests,
then every round both parties' turns run at once and one worker task joins their steps.
The job's result (each party's own final weights and the job's top segment) equals, bit
for bit (``torch.equal``), the unsplit multi-input model trained on the same aligned
batches; no hospital handed its weights to another, and no identifier reached the
coordinator or the audit log. Once it completed, the job is evaluated through the split
on the parties' test records, aligned by PSI as the training records are: the label
party's figures equal the unsplit model's on the same aligned test batches. Then the
label party asks (``medsplit-agent predict --job N --ids FILE``) for predictions on
records of its own, some of which the imaging site lacks: both agents answer, and the
CSV holds the unsplit model's predictions for the records both hold and "not held by
every party" for the rest; with the imaging site's agent stopped (offline), the request
is refused at once, naming it.
"""

from __future__ import annotations

import copy
import csv
import random
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from django.conf import settings
from django.utils import timezone

from hospital_agent.data import DataSource, load_vertical
from hospitals.models import Hospital
from medsplit.data import synthetic_split
from medsplit.protocol.handoff import import_parties
from medsplit.protocol.party import Party
from medsplit.psi import Alignment, common_order
from medsplit.training.evaluate import classification_metrics, majority_baseline
from medsplit.training.verify import deterministic
from medsplit.training.vertical_model import train_vertical_unsplit
from medsplit.training.vertical_parts import (
    aligned_split,
    job_vertical_model,
    party_batches,
    party_parties,
)
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests import zygote
from tests.workers.agents import Agents, audit, consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, wait_until, workers_relay_user
from training.models import Evaluation, HandOff, HospitalEvaluation, LabelLeakage, Turn
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N = 96
#: The second party lacks the first ten patients and lists the rest in its own order.
MISSING = 10
#: The lab's numeric columns.
COLUMNS = 12
#: Test patients; the imaging site lacks the first four.
NT = 40
MISSING_TEST = 4


def _write_ids(path: Path, ids) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id"])
        writer.writerows([i] for i in ids)


def _write_party(
    folder: Path, name: str, images: torch.Tensor, labels, ids, test: tuple
) -> dict[str, str]:
    """A MedMNIST-format archive of ``images`` (and the ``test`` split's) and CSVs of
    their identifiers."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{name}.npz"
    pixels = (images[:, 0] * 255).round().to(torch.uint8).numpy()
    test_images, test_ids = test
    np.savez(
        archive,
        train_images=pixels,
        train_labels=np.asarray(labels).reshape(-1, 1),
        test_images=(test_images[:, 0] * 255).round().to(torch.uint8).numpy(),
        test_labels=np.zeros((len(test_ids), 1), dtype=np.int64),
    )
    _write_ids(folder / f"{name}-ids.csv", ids)
    _write_ids(folder / f"{name}-test-ids.csv", test_ids)
    return {
        "MEDSPLIT_AGENT_DATA_KIND": "medmnist",
        "MEDSPLIT_AGENT_DATA_PATH": str(archive),
        "MEDSPLIT_AGENT_DATA_IDENTIFIERS_CSV": str(folder / f"{name}-ids.csv"),
        "MEDSPLIT_AGENT_DATA_TEST_IDENTIFIERS_CSV": str(folder / f"{name}-test-ids.csv"),
    }


def _write_table(
    folder: Path, features: torch.Tensor, labels, ids, name: str = "lab"
) -> dict[str, str]:
    """A CSV of identifier, numeric columns and label: the lab's records."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *(f"value{c}" for c in range(COLUMNS)), "diagnosis"])
        for i, row, label in zip(ids, features.tolist(), labels, strict=True):
            writer.writerow([i, *(f"{v:.6f}" for v in row), int(label)])
    return {
        "MEDSPLIT_AGENT_DATA_KIND": "table",
        "MEDSPLIT_AGENT_DATA_PATH": str(path),
        "MEDSPLIT_AGENT_DATA_LABEL_COLUMN": "diagnosis",
    }


def _predict(env: dict[str, str], job: int, ids: Path, out: Path):
    command = [sys.executable, "-m", "hospital_agent", "predict", "--job", str(job)]
    return zygote.run([*command, "--ids", str(ids), "--out", str(out)], env=env, timeout=180)


def test_a_vertical_job_aligns_privately_and_equals_the_unsplit_model(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    data = synthetic_split(N, shape=(1, 28, 28), seed=4)
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(N, COLUMNS, generator=generator) + data.labels[:, None].float()
    ids = [f"patient-{i:04d}" for i in range(N)]
    order = list(range(MISSING, N))
    random.Random(1).shuffle(order)
    test = synthetic_split(NT, shape=(1, 28, 28), seed=6)
    test_values = torch.randn(NT, COLUMNS, generator=generator) + test.labels[:, None].float()
    test_ids = [f"patient-t{i:04d}" for i in range(NT)]
    test_order = list(range(MISSING_TEST, NT))
    random.Random(2).shuffle(test_order)
    own = {
        0: _write_table(tmp_path / "data", values, data.labels.tolist(), ids),
        1: _write_party(
            tmp_path / "data",
            "imaging",
            data.images[order],
            np.zeros(len(order), dtype=np.int64),
            [ids[i] for i in order],
            (test.images[test_order], [test_ids[i] for i in test_order]),
        ),
    }
    lab_test = _write_table(
        tmp_path / "data", test_values, test.labels.tolist(), test_ids, name="lab-test"
    )
    own[0]["MEDSPLIT_AGENT_DATA_TEST_PATH"] = lab_test["MEDSPLIT_AGENT_DATA_PATH"]
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 2, own=own)
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker-a")
        processes.celery_beat()
        imaging = agents.hospitals[1].slug
        imaging_pk = agents.hospitals[1].pk
        job = small_job(
            admin_actor,
            agents.hospitals,
            model="tabular_mlp",
            mode="vertical",
            mode_options={"join": "sum", "labels": "hospital", "min_records": 10},
            cuts=["block1", "block3"],
            party_models={
                imaging: {"model": "small_cnn", "input_shape": [1, 28, 28], "cut": "flatten"}
            },
            rounds=2,
            max_steps_per_turn=3,
        )
        assert job.job_description().input_shape == (COLUMNS,)
        wait_completed(processes, job, agents, 300)
        wait_until(
            "the joint evaluation to end",
            lambda: Evaluation.objects.filter(job=job, attempt=1, status="completed").exists(),
            120,
            processes,
        )
        # The label party's prediction: records both hold, and some the imaging site lacks.
        asked = [*ids[:3], *ids[20:30], *test_ids[:2], *test_ids[10:15]]
        (tmp_path / "ask.csv").write_text("".join(f"{i}\n" for i in asked))
        out = tmp_path / "out" / "predictions.csv"
        done = _predict(agents.env["agent-0"], job.pk, tmp_path / "ask.csv", out)
        assert done.returncode == 0, f"{done.stderr}\n{processes.logs()}"
        assert "15 predictions written" in done.stdout, done.stdout
        # The imaging site's agent stops: offline once its last heartbeat is older than
        # the window (aged here rather than waited for).
        processes.stop("agent-1")
        window = timedelta(seconds=settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"] + 5)
        Hospital.objects.filter(pk=imaging_pk).update(last_seen_at=timezone.now() - window)
        offline = _predict(agents.env["agent-0"], job.pk, tmp_path / "ask.csv", out)
        assert offline.returncode != 0 and f"{imaging} sent no heartbeat" in offline.stderr
        # An identifier the label party does not hold itself: refused before anything is
        # asked of the coordinator or the other parties.
        (tmp_path / "unknown.csv").write_text(f"{ids[0]}\nnobody-here\n")
        unknown = _predict(agents.env["agent-0"], job.pk, tmp_path / "unknown.csv", out)
        assert unknown.returncode == 2, unknown.stderr
        assert "1 of the 2 requested identifiers are not among" in unknown.stderr
        assert "'nobody-here'" in unknown.stderr
        assert Evaluation.objects.filter(job=job, purpose="prediction").count() == 1

    turns = sorted(Turn.objects.filter(job=job), key=lambda t: (t.round_id, t.position))
    assert [t.status for t in turns] == ["completed"] * 4
    assert turns[1].started_at < turns[0].finished_at, "the round's two turns ran at once"
    assert not HandOff.objects.filter(job=job).exists(), "a party handed its weights on"
    agreed = audit(job, "alignment.agreed")
    assert [e.details for e in agreed] == [{"size": N - MISSING}]
    job.refresh_from_db()
    assert job.alignment.status == "agreed" and job.alignment.size == N - MISSING
    # The label-leakage audit: the passive party's scores, sealed for the label party,
    # scored against its labels each round; the coordinator holds the AUCs only.
    leakage = LabelLeakage.objects.filter(job=job).order_by("round_index")
    assert [(r.round_index, r.hospital_id, r.records) for r in leakage] == [
        (0, agents.hospitals[1].pk, 48),
        (1, agents.hospitals[1].pk, 48),
    ]
    assert all(0.0 <= r.norm_auc <= 1.0 and 0.0 <= r.cosine_auc <= 1.0 for r in leakage)
    assert len(audit(job, "leakage.reported")) == 2

    # The reference: the unsplit multi-input model over the same aligned batches.
    config = job.training_config()
    participants = tuple(h.slug for h in agents.hospitals)
    fronts = job.job_description().party_fronts()
    model = job_vertical_model(job_model(job), config, participants, fronts)
    shared = set(ids[MISSING:])
    alignment = Alignment(common_order(tuple(shared), seed=config.seed), config.seed)
    rows = {}
    sources = [
        (
            DataSource(
                kind="table", path=own[0]["MEDSPLIT_AGENT_DATA_PATH"], label_column="diagnosis"
            ),
            None,
        ),
        (
            DataSource(
                kind="medmnist",
                path=own[1]["MEDSPLIT_AGENT_DATA_PATH"],
                identifiers_csv=own[1]["MEDSPLIT_AGENT_DATA_IDENTIFIERS_CSV"],
            ),
            (1, 28, 28),
        ),
    ]
    for i, hospital in enumerate(agents.hospitals):
        source, shape = sources[i]
        records = load_vertical(source, input_shape=shape, num_classes=2)
        index = torch.tensor(alignment.positions(records.identifiers, source=hospital.slug))
        labels = records.labels[index] if i == 0 else None
        rows[hospital.slug] = aligned_split(records.features[index], labels)

    def batches():
        for round_ in range(config.rounds):
            steps = [
                party_batches(config, alignment, rows[p], round_=round_, position=0)
                for p in participants
            ]
            for per_party in zip(*steps, strict=True):
                yield {p: b.x for p, b in zip(participants, per_party, strict=True)}, per_party[0].y

    with deterministic():
        want = train_vertical_unsplit(model, batches(), config).state_dict()
    top = Party.create(copy.deepcopy(model.top), config.server_optimizer)
    row = job.server_checkpoint
    assert (row.round_index, row.position, row.step) == (2, 0, 0), "the last round's end"
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: top})
    got = {f"top.{k}": v for k, v in top.module.state_dict().items()}
    for i, slug in enumerate(participants):
        parties = party_parties(model, config, slug)
        import_parties(agents.final(job, i).read_bytes(), parties)
        got.update(
            {f"fronts.{slug}.{k}": v for k, v in parties["front"].module.state_dict().items()}
        )
        if "head" in parties:
            got.update({f"head.{k}": v for k, v in parties["head"].module.state_dict().items()})
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{name} differs from the unsplit model"

    # The evaluation: the unsplit model's figures on the same aligned test batches.
    parts = list(
        HospitalEvaluation.objects.filter(job=job, evaluation__purpose="evaluation").order_by(
            "position"
        )
    )
    assert [p.status for p in parts] == ["completed"] * 2, [p.failure_reason for p in parts]
    shared_test = set(test_ids[MISSING_TEST:])
    test_alignment = Alignment(common_order(tuple(shared_test), seed=config.seed), config.seed)
    test_sources = [
        DataSource(
            kind="table", path=lab_test["MEDSPLIT_AGENT_DATA_PATH"], label_column="diagnosis"
        ),
        DataSource(
            kind="medmnist",
            path=own[1]["MEDSPLIT_AGENT_DATA_PATH"],
            split="test",
            identifiers_csv=own[1]["MEDSPLIT_AGENT_DATA_TEST_IDENTIFIERS_CSV"],
        ),
    ]
    inputs = {}
    for i, slug in enumerate(participants):
        records = load_vertical(test_sources[i], input_shape=sources[i][1], num_classes=2)
        index = torch.tensor(test_alignment.positions(records.identifiers, source=slug))
        inputs[slug] = records.features[index]
        if i == 0:
            test_labels = records.labels[index]
    whole = copy.deepcopy(model)
    whole.load_state_dict(want)
    whole.eval()
    size = len(test_alignment)
    with torch.no_grad():
        logits = torch.cat(
            [
                whole({p: x[i : i + config.batch_size] for p, x in inputs.items()})
                for i in range(0, size, config.batch_size)
            ]
        )
    expected = classification_metrics(logits, test_labels)
    lab_labels = load_vertical(sources[0][0], num_classes=2).labels
    assert parts[0].metrics == {
        "accuracy": expected["val_accuracy"],
        "auc": expected["val_auc"],
        "baseline_accuracy": majority_baseline(lab_labels, test_labels).accuracy,
        "samples": size,
    }
    assert parts[1].metrics == {} and [p.test_samples for p in parts] == [size, size]

    # The prediction: the unsplit model's on the aligned records, in the same batches.
    held = {slug: {} for slug in participants}
    for i, slug in enumerate(participants):
        for source in (sources[i][0], test_sources[i]):
            records = load_vertical(source, input_shape=sources[i][1], num_classes=2)
            held[slug].update(zip(records.identifiers, records.features, strict=True))
    both = set(asked) & set(held[participants[1]])
    order = common_order(tuple(both), seed=config.seed)
    with torch.no_grad():
        reference = torch.cat(
            [
                whole(
                    {
                        p: torch.stack([held[p][r] for r in order[i : i + config.batch_size]])
                        for p in participants
                    }
                )
                for i in range(0, len(order), config.batch_size)
            ]
        )
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["identifier"] for r in rows] == asked
    want_row = {}
    for r, logit in zip(order, reference, strict=True):
        p = torch.softmax(logit.to(torch.float64), dim=0)
        want_row[r] = [str(int(p.argmax())), *(f"{v:.6f}" for v in p.tolist())]
    for row in rows:
        got_row = [row["predicted"], row["p_0"], row["p_1"]]
        if row["identifier"] in both:
            assert row["status"] == "predicted" and got_row == want_row[row["identifier"]]
        else:
            assert row["status"] == "not held by every party" and got_row == ["", "", ""]
    predicted = Evaluation.objects.get(job=job, purpose="prediction")
    assert [p.test_samples for p in predicted.parts.order_by("position")] == [15, 15]
    assert not any("patient-" in str(e.details) for e in audit(job)), "an identifier leaked"
