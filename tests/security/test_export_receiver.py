"""Export by consent with real processes: the coordinator (a live server), the real Redis,
a Celery worker and beat, two agent processes; then ``medsplit-agent approve-export``,
``refuse-export`` and ``fetch-export`` as processes of their own.

A vanilla job completes; hospital 0 is to receive its model. One export is refused by
hospital 1: it stops, nothing is sealed. In a second, hospital 1 turns hostile and seals
another front than the job's final one: the receiver refuses it by name and writes
nothing. In a third, whoever owns the coordinator's database flips one byte of the sealed
server segment: the receiver refuses that part by name, writes nothing and keeps its
export key; with the part restored the export goes through: the model written loads with
``medsplit.models`` and equals the split model on the receiver's validation images
(``torch.equal``), every step is audited, the coordinator holds ciphertext only, and the
export key is gone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_tensors

from audit.models import AuditEvent
from exports import services as export_services
from exports.models import ExportPart, ModelExport
from hospital_agent.coordinator import Coordinator
from hospital_agent.data import DataSource, load_local, prepare
from hospital_agent.export import load_export
from hospital_agent.export_flow import export_key_path
from hospital_agent.identity import load_credentials, load_identity
from hospital_agent.pins import Pins
from medsplit.protocol.handoff import import_parties
from medsplit.protocol.keys import SignedRecipientKey
from medsplit.protocol.sealing import SealContext, seal
from medsplit.training.setup import client_parties, server_party
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests import zygote
from tests.workers.agents import (
    SAMPLES,
    VAL_FRACTION,
    Agents,
    consortium,
    small_job,
    wait_completed,
)
from tests.workers.processes import Processes, processes, wait_until, workers_relay_user
from training.models import Job
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def command(env: dict[str, str], *args: str) -> zygote.Captured:
    return zygote.Captured(
        [sys.executable, "-m", "hospital_agent", *args, "--wait", "90"], env=env, cwd=os.getcwd()
    )


def finished(*running: zygote.Captured) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=180) for p in running]
    return [(p.returncode, *o) for p, o in zip(running, outputs, strict=True)]


def hostile_front(work_dir: Path, coordinator_url: str, export_id: int, job: Job) -> None:
    """Hospital 1's agent, turned hostile: approves, then seals a front that is not the
    job's final one to the receiver's (genuine) export key."""
    credentials, identity = load_credentials(work_dir), load_identity(work_dir)
    api = Coordinator(coordinator_url, token=credentials.token)
    api.approve_export(export_id)
    info = api.export(export_id)
    while info["state"] != "approved":
        time.sleep(0.5)
        info = api.export(export_id)
    state = final_state(work_dir, job)
    name = sorted(state)[0]
    state[name] = state[name] + 1e-3
    participant = next(
        p for p in api.assignment(job.pk)["participants"] if p["hospital"] == info["recipient"]
    )
    signed = SignedRecipientKey.from_json(
        job=f"export-{export_id}", hospital=info["recipient"], data=info["recipient_key"]
    )
    blob = seal(
        save_tensors(state),
        sender=identity,
        recipient=signed,
        recipient_identity=Pins(work_dir).identity(participant),
        context=SealContext(
            job=f"export-{export_id}",
            round=0,
            sender=credentials.hospital,
            recipient=info["recipient"],
            purpose="export",
        ),
    )
    api.upload_export_part(export_id, blob)


def final_state(work_dir: Path, job: Job) -> dict[str, torch.Tensor]:
    """A hospital's final front as its agent keeps it, under the model's names."""
    config = job.training_config()
    parties = client_parties(job_model(job).split(config), config)
    import_parties(
        (work_dir / "jobs" / f"job-{job.pk}" / "final.safetensors").read_bytes(), parties
    )
    return {n: t.contiguous() for p in parties.values() for n, t in p.module.state_dict().items()}


def test_a_model_is_exported_only_by_consent_and_equals_the_split_model(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 2)
    receiver, sender = agents.env["agent-0"], agents.env["agent-1"]
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker-a")
        processes.celery_beat()
        job = small_job(admin_actor, agents.hospitals, max_steps_per_turn=3)
        wait_completed(processes, job, agents, 120)
        slug = agents.hospitals[0].slug
        refused, hostile, honest = (
            export_services.export_create(actor=admin_actor, job_id=job.pk, recipient_slug=slug)
            for _ in range(3)
        )
        results = finished(
            command(sender, "refuse-export", "--export", str(refused.pk), "--reason", "ethics"),
            command(receiver, "approve-export", "--export", str(hostile.pk)),
            command(receiver, "approve-export", "--export", str(honest.pk)),
        )
        assert [r[0] for r in results] == [0, 0, 0], results
        late = command(receiver, "approve-export", "--export", str(refused.pk))
        agreed = command(sender, "approve-export", "--export", str(honest.pk))
        hostile_front(tmp_path / "agent-1", consortium, hostile.pk, job)
        (late_rc, _, late_err), (agreed_rc, agreed_out, agreed_err) = finished(late, agreed)
        assert late_rc == 2 and f"refused by {agents.hospitals[1].slug}" in late_err, late_err
        assert agreed_rc == 0 and "segments sealed" in agreed_out, agreed_err

        server_part = wait_until(
            "the worker's sealed server segment",
            lambda: ExportPart.objects.filter(export=honest, name="server").first(),
            60,
            processes,
        )
        sealed = bytes(server_part.ciphertext)
        flipped = bytearray(sealed)
        flipped[len(sealed) // 2] ^= 1
        ExportPart.objects.filter(pk=server_part.pk).update(ciphertext=bytes(flipped))

        out_hostile, out = tmp_path / "hostile-model", tmp_path / "model"
        (bad_rc, _, bad_err), (tampered_rc, _, tampered_err) = finished(
            command(
                receiver, "fetch-export", "--export", str(hostile.pk), "--out", str(out_hostile)
            ),
            command(receiver, "fetch-export", "--export", str(honest.pk), "--out", str(out)),
        )
        assert tampered_rc == 2 and "the part from server is refused" in tampered_err, tampered_err
        assert not out.exists() and export_key_path(tmp_path / "agent-0", honest.pk).exists()
        ExportPart.objects.filter(pk=server_part.pk).update(ciphertext=sealed)
        ((rc, stdout, stderr),) = finished(
            command(receiver, "fetch-export", "--export", str(honest.pk), "--out", str(out))
        )
    assert bad_rc == 2 and f"{agents.hospitals[1].slug} sent segments that are not" in bad_err
    assert not out_hostile.exists()
    assert rc == 0, f"{stderr}\n{processes.logs()}"
    assert "the model equals the split model" in stdout

    # Refused: nothing sealed. Approved: every part ciphertext, the export key gone.
    assert not ExportPart.objects.filter(export=refused).exists()
    assert ModelExport.objects.get(pk=refused.pk).state == "refused"
    parts = ExportPart.objects.filter(export=honest)
    assert sorted(parts.values_list("name", flat=True)) == [agents.hospitals[1].slug, "server"]
    for part in parts:
        assert bytes(part.ciphertext).startswith(b"MSPLSEAL")
    assert not export_key_path(tmp_path / "agent-0", honest.pk).exists()
    assert export_key_path(tmp_path / "agent-0", hostile.pk).exists()  # for a retry
    actions = list(
        AuditEvent.objects.filter(target=f"export:{honest.pk}").values_list("action", flat=True)
    )
    assert actions[:2] == ["export.requested", "export.key_published"]
    assert actions.count("export.approved") == 2 and actions.count("export.part_sealed") == 2
    assert actions[-1] == "export.fetched"

    # The exported model, loaded with medsplit.models, against the split model.
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["model_name"], meta["cut"], meta["job_id"]) == ("small_cnn", ["pool1"], job.pk)
    assert meta["input_shape"] == [1, 28, 28] and meta["audit_head"]
    model = load_export(out)
    job.refresh_from_db()
    config = job.training_config()
    split = job_model(job).split(config)
    server, clients = server_party(split, config), client_parties(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    import_parties(agents.final(job, 0).read_bytes(), clients)
    source = DataSource(kind="synthetic", samples=SAMPLES, seed=10, shape=(1, 28, 28))
    data, _ = load_local(
        source, input_shape=(1, 28, 28), num_classes=2, val_fraction=VAL_FRACTION, seed=10
    )
    images = prepare(data, input_shape=(1, 28, 28), num_classes=2).val.images
    with torch.no_grad():
        want = server.module.eval()(**clients["front"].module.eval()(images))
        assert torch.equal(model(images), want)
