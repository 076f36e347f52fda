"""SplitFed through the platform, with real processes: the coordinator (a live server),
the real Redis with a user per hospital, two Celery workers and beat, and two agent
processes; SFLV1 with the labels at the server, SFLV2 with the labels at home.

Each round the two hospitals train at once, each with its own copy of the server segment
(SFLV1: one task per turn) or on one shared segment serving their steps in the order drawn
from the job's seed (SFLV2: one task for the round); then each masks its segments and
submits them through the relay, a worker sums the masked vectors, and each hospital
unmasks the average. The job's result (every agent's final weights and the job's server
segment) equals, bit for bit (``torch.equal``), the in-process reference that trains each
hospital's whole model over the same batches and averages in the same fixed-point
arithmetic in the clear (``train_parallel_unsplit``); no hospital handed its weights to
another, and the audit log holds every submission and aggregate by size and digest only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medsplit.protocol.handoff import import_parties
from medsplit.training.parallel_reference import train_parallel_unsplit
from medsplit.training.setup import client_parties, server_party
from medsplit.training.verify import deterministic
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.workers.agents import Agents, audit, consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, workers_relay_user
from training.models import Aggregation, HandOff, Turn
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


#: Both variants, each with one placement of the labels, one job after the other on the
#: same agents and workers (starting the processes is most of a job's time here).
CASES = [("v1", "server"), ("v2", "hospital")]


def test_splitfed_trains_in_parallel_and_averages_securely_and_exactly(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 2)
    jobs = []
    with workers_relay_user(redis_url, processes):
        # SFLV1's two turns at once: two workers, one turn each; SFLV2: one task.
        processes.celery_worker("worker-a")
        processes.celery_worker("worker-b")
        processes.celery_beat()
        for variant, labels in CASES:
            job = small_job(
                admin_actor,
                agents.hospitals,
                mode="splitfed",
                mode_options={"variant": variant, "labels": labels},
                cuts=["pool1"] if labels == "server" else ["pool1", "pool"],
                rounds=2,
                max_steps_per_turn=3,
            )
            wait_completed(processes, job, agents, 300)
            jobs.append(job)
    for job in jobs:
        assert_secure_and_exact(job, agents)


def assert_secure_and_exact(job, agents: Agents) -> None:
    """Both rounds ran at once and through a done aggregation; the result is exact."""
    turns = sorted(Turn.objects.filter(job=job), key=lambda t: (t.round_id, t.position))
    assert [t.status for t in turns] == ["completed"] * 4
    assert turns[1].started_at < turns[0].finished_at, "the round's two turns ran at once"
    assert not HandOff.objects.filter(job=job).exists(), "a hospital handed weights on"
    done = Aggregation.objects.filter(job=job, status="done").order_by("round_index")
    assert [(a.round_index, a.attempt) for a in done] == [(0, 0), (1, 0)]
    for aggregation in done:
        assert set(aggregation.weights) == {h.slug for h in agents.hospitals}
        assert len(aggregation.aggregate_sha256) == 64
    submitted = audit(job, "aggregation.submitted")
    assert len(submitted) == 4
    assert all(
        set(e.details) == {"round", "group", "attempt", "sha256", "size_bytes"} for e in submitted
    )
    assert len(audit(job, "aggregation.done")) == 2

    # The reference: each hospital's whole model over its batches, averaged in the ring.
    job.refresh_from_db()
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    with deterministic():
        want = train_parallel_unsplit(model.build(), agents.trains(job), config, split)
    want_state = want.state_dict()
    server = server_party(split, config)
    row = job.server_checkpoint
    assert (row.round_index, row.position, row.step) == (2, 0, 0), "the combined result's place"
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    server_state = dict(server.module.state_dict())
    for i in range(2):  # each hospital unmasked the average itself
        clients = client_parties(split, config)
        import_parties(agents.final(job, i).read_bytes(), clients)
        got = dict(server_state)
        for party in clients.values():
            got.update(party.module.state_dict())
        assert got.keys() == want_state.keys()
        for name, value in want_state.items():
            assert torch.equal(got[name], value), f"agent {i}: {name} differs from the reference"
