"""A hijacking server against a real hospital agent process, end to end.

The hospital is a real ``python -m hospital_agent run`` process enrolled at the
coordinator (a live server) and reaching the relay with its own Redis user; its job has
``privacy.hijack_detection`` on (SplitOut). The server side of its turn is the worker's
own turn runner (``workers.turn_runner.run``: the claim, the lease, the checkpoints,
the turn's end), run in this test's process with the test harness's feature-space
hijacker as its server role (``tests/hijack_server.py``): its crafted gradients cross the
relay as ordinary frames on the job's relay keys. No Celery process runs; the test plays
the scheduler (``job_advance_group``) too.

The agent detects the hijacking, applies nothing of the tripping frame nor any later
step (its last snapshot is the replay of the steps before it, ``torch.equal``), tells the
coordinator, which fails the turn and audits ``job.hijack_suspected``; the job's retry is
refused by the agent's mark without a frame; the API serves the alert on the job and on
the hospital.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from audit.models import AuditEvent
from hospitals.hijack import ACTION
from medsplit.data import synthetic_split
from medsplit.defenses.hijack import REASON_PREFIX
from medsplit.protocol.handoff import import_parties
from medsplit.training.schedule import turn_batches
from medsplit.training.setup import cached_split, client_parties
from medsplit.training.verify import deterministic
from medsplit.turns import TurnServer
from medsplit.wire import Frame
from tests.hijack_server import FeatureSpaceHijacker
from tests.workers.agents import Agents, consortium, small_job
from tests.workers.processes import Processes, processes, wait_until
from training.models import Turn
from training.scheduling import job_advance_group
from training.states import JobState
from workers import turn_runner

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

AUX = synthetic_split(64, seed=1)  # the attacker's own images of the same kind


class RecordingHijacker(FeatureSpaceHijacker):
    """The harness's hijacker, keeping every gradient frame it sent, by step."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent: dict[int, Frame] = {}

    def handle(self, frame: Frame) -> Frame:
        reply = super().handle(frame)
        self.sent[frame.meta.step] = reply
        return reply


def _serve(turn: Turn, attacker: RecordingHijacker, monkeypatch) -> str:
    """The worker's turn runner on ``turn``, its server role the hijacker's."""

    def hijacking_server(**kwargs) -> TurnServer:
        return TurnServer(**kwargs, role=lambda: attacker)

    with monkeypatch.context() as m:
        m.setattr(turn_runner, "TurnServer", hijacking_server)
        return turn_runner.run(turn.pk, runner="hijacker").outcome


def test_a_real_agent_catches_a_hijacking_server_and_takes_no_further_step(
    processes: Processes,
    consortium: str,
    tmp_path: Path,
    admin_actor,
    consortium_admin,
    client_for,
    settings,
    monkeypatch,
) -> None:
    # A snapshot before every step at the agent (the server sets how often), so that its
    # last one shows exactly which steps it applied.
    settings.MEDSPLIT = {**settings.MEDSPLIT, "CHECKPOINT_EVERY": 1}
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 1)
    (hospital,) = agents.hospitals
    job = small_job(
        admin_actor,
        agents.hospitals,
        privacy={"hijack_detection": {"method": "splitout", "honest_records": 48}},
        max_retries=1,
    )
    config = job.training_config()
    split = cached_split(turn_runner.job_model(job), config.cuts)
    attacker = RecordingHijacker(boundary=split.boundaries[0], aux=AUX.images, seed=0, lr=1e-3)

    (first,) = job_advance_group(job_id=job.pk)
    # The agent's report failed the turn; the runner finds it taken away and stops.
    assert _serve(first, attacker, monkeypatch) == "stopped"
    first.refresh_from_db()
    assert first.status == Turn.Status.FAILED
    reason = first.failure_reason.split(": ", 1)[1]  # "<slug> reported a ...: <reason>"
    assert reason.startswith(REASON_PREFIX) and "refuses every further step" in reason

    # The agent's mark names the step whose gradient frame tripped its detector.
    folder = tmp_path / "agent-0" / "jobs" / f"job-{job.pk}"
    mark = json.loads((folder / "hijack-detected.json").read_text())
    detected = mark["step"]
    assert mark["reason"] == reason and 0 < detected < 8  # within the turn's 8 steps
    # The hijacker was sent the activations of every step up to it, and none after.
    assert sorted(attacker.sent) == list(range(detected + 1))
    # Nothing of the tripping frame was applied: the agent's last snapshot is the state
    # "before step `detected`", exactly the replay of the hijacker's gradients before it.
    snapshots = folder / "round-0-position-0"
    names = sorted(p.name for p in snapshots.glob("before-*.safetensors"))
    assert names[-1] == f"before-{detected:08d}.safetensors"
    with deterministic():
        parties = client_parties(split, config)
        role = config.split_mode.client_role(parties, split, codec=config.codec)
        train = agents.trains(job)[0]
        batches = turn_batches(config, train, round_=0, hospital=0)
        for step, batch in zip(range(detected), batches, strict=False):
            role.start(batch.ids, batch.x, batch.y)
            role.receive(attacker.sent[step])
    kept = client_parties(split, config)
    import_parties((snapshots / names[-1]).read_bytes(), kept)
    for name, party in parties.items():
        want, got = party.module.state_dict(), kept[name].module.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), f"{name} differs"

    # The job's retry: the agent refuses it by its mark, sending no frame at all.
    (retry,) = job_advance_group(job_id=job.pk)
    assert retry.attempt == 2
    # (The agent may refuse it before the runner claims it: then there is nothing to run.)
    assert _serve(retry, attacker, monkeypatch) in ("stopped", "not claimed")
    retry.refresh_from_db()
    assert retry.failure_reason.split(": ", 1)[1] == reason
    assert sorted(attacker.sent) == list(range(detected + 1))
    # The agent's own account: one turn taken, two refusals (the detection, the mark).
    log = (processes.folder / "agent-0.log").read_text(errors="replace")
    assert log.count(": my turn (") == 1
    assert log.count(f"ERROR hospital_agent.hijack: job {job.pk}: {REASON_PREFIX}") == 2
    assert job_advance_group(job_id=job.pk) == []
    job.refresh_from_db()
    assert job.state == JobState.FAILED

    # Each refusal is audited as a hijack report, by the hospital.
    events = AuditEvent.objects.filter(action=ACTION, job_id=job.pk).order_by("pk")
    assert [(e.hospital, e.details["turn"], e.details["reason"]) for e in events] == [
        (hospital.slug, first.pk, reason),
        (hospital.slug, retry.pk, reason),
    ]
    # The dashboard's API serves the alert on the job and on the hospital.
    api = client_for(consortium_admin)
    alerts = api.get(f"/api/jobs/{job.pk}/").json()["hijack_alerts"]
    assert [(a["hospital"], a["turn"], a["reason"]) for a in alerts] == [
        (hospital.slug, first.pk, reason),
        (hospital.slug, retry.pk, reason),
    ]
    alerts = api.get(f"/api/hospitals/{hospital.slug}/").json()["hijack_alerts"]
    assert [(a["job"], a["reason"]) for a in alerts] == [(job.pk, reason), (job.pk, reason)]
    # The hospital never finished a turn: nothing handed on, no final model.
    assert not agents.final(job, 0).exists()
    wait_until("the agent to stay up", lambda: processes.started["agent-0"].poll() is None, 1)
