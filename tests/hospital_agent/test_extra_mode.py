"""A third mode added by configuration only, end to end with real processes.

:class:`ToyParallel` lives in this file and nowhere else: two hospitals in one parallel
group, each turn with its own copy of the server segment, every round after the first
starting from the element-wise mean of the last round's fronts and of its server
segments. The coordinator (the live server in this process) loads it through
``MEDSPLIT["EXTRA_MODES"]``, the Celery workers through ``MEDSPLIT_EXTRA_MODES``, the
agents through ``MEDSPLIT_AGENT_EXTRA_MODES``; a real job runs two rounds, and each
hospital's end state and their mean equal the same arithmetic done here on the whole
model (``torch.equal``).

The module imports only the core at its top: the agent processes import it for the mode,
and an agent never imports Django.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import torch

from medsplit.modes import StartFrom
from medsplit.modes.vanilla import VanillaMode

NAME = "toyparallel"
PATH = f"{__name__}:ToyParallel"


class ToyParallel(VanillaMode):
    """Vanilla's step, whose roles take this mode's name from it (no role subclassed);
    every hospital in one group; later rounds start from the mean."""

    name = NAME
    title = "Toy parallel"
    summary = "every hospital at once, each with its own server segment; then their mean"

    def plan_round(self, participants: Sequence[object]) -> list[tuple[object, ...]]:
        return [tuple(participants)]

    def start_from(self, round_index: int, group_index: int) -> StartFrom:
        return StartFrom.INITIAL if round_index == 0 else StartFrom.AGGREGATE

    def combine(self, states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {k: mean([s[k] for s in states]) for k in states[0]}


def mean(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """The element-wise mean, in the order given (the reference below uses it too)."""
    return torch.stack(list(values)).mean(dim=0)


@pytest.fixture
def processes(tmp_path: Path, redis_url: str, settings) -> Iterator[object]:
    """The harness's ``processes`` (tests/workers/processes.py), imported only here: that
    module imports the coordinator's models, which the agents importing this file for the
    mode must not."""
    from tests.workers import processes as harness

    yield from harness.processes.__wrapped__(tmp_path, redis_url, settings)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_mode_from_the_configuration_runs_a_parallel_job_end_to_end(
    processes, live_server, settings, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    from django.core.cache import cache

    from medsplit.modes import MODES, load_extra_modes
    from medsplit.protocol.handoff import import_parties
    from medsplit.training.reference import train_unsplit
    from medsplit.training.schedule import turn_batches
    from medsplit.training.setup import client_parties, server_party
    from medsplit.training.verify import deterministic
    from medsplit.turns.server import SERVER_PARTY
    from medsplit.turns.stores import read_verified
    from tests.workers.agents import Agents, small_job, wait_completed
    from tests.workers.processes import wait_evaluated, workers_relay_user
    from training.models import ServerCheckpoint, Turn
    from training.runs import checkpoint_dir
    from workers.turn_runner import job_model

    if not redis_url.startswith("redis://"):
        pytest.skip("per-hospital Redis users need a Redis reached over TCP")
    saved = dict(MODES)
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": redis_url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        "EXTRA_MODES": [PATH],
    }
    try:
        load_extra_modes(settings.MEDSPLIT["EXTRA_MODES"])  # what the app's ready() does
        cache.clear()  # the live server's throttles: every agent enrols from 127.0.0.1
        processes.env["MEDSPLIT_EXTRA_MODES"] = PATH
        agents = Agents(processes, live_server.url, tmp_path).enrol(
            admin_actor, 2, extra={"MEDSPLIT_AGENT_EXTRA_MODES": PATH}
        )
        with workers_relay_user(redis_url, processes):
            # Two turns at once: two workers, one turn each.
            processes.celery_worker("worker-a")
            processes.celery_worker("worker-b")
            processes.celery_beat()
            job = small_job(admin_actor, agents.hospitals, mode=NAME, rounds=2)
            wait_completed(processes, job, agents, 300)
            wait_evaluated(processes, job)
            # Stopped while their Redis user exists: a worker without it retries until killed.
            processes.stop_all()

        turns = Turn.objects.filter(job=job).select_related("round")
        assert sorted((t.round.index, t.group, t.position, t.status) for t in turns) == [
            (0, 0, 0, "completed"),
            (0, 0, 1, "completed"),
            (1, 0, 0, "completed"),
            (1, 0, 1, "completed"),
        ]
        first = sorted(turns, key=lambda t: (t.round.index, t.position))
        assert first[1].started_at < first[0].finished_at, "the two turns ran at once"

        config = job.training_config()
        model = job_model(job)
        split = model.split(config)
        trains = agents.trains(job)
        # The reference: each turn trains the whole model from its round's start, with
        # fresh optimizers, on the hospital's batches; the next round starts from the mean.
        with deterministic():
            start = model.build()
            for round_ in range(2):
                ends = []
                for h in range(2):
                    batches = turn_batches(config, trains[h], round_=round_, hospital=h)
                    ends.append(
                        train_unsplit(start, trains, config, split, batches=batches).state_dict()
                    )
                means = {k: mean([e[k] for e in ends]) for k in ends[0]}
                start = model.build()
                start.load_state_dict(means)

        finals = []
        for h in range(2):
            # This hospital's end of round 1: its front from its work directory, its
            # server segment from its turn's last checkpoint.
            clients = client_parties(split, config)
            state = agents.folder / f"agent-{h}" / "jobs" / f"job-{job.pk}" / "state.safetensors"
            import_parties(state.read_bytes(), clients)
            row = (
                ServerCheckpoint.objects.filter(job=job, round_index=1, position=h)
                .order_by("step")
                .last()
            )
            server = server_party(split, config)
            import_parties(
                read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server}
            )
            got = dict(server.module.state_dict())
            for party in clients.values():
                got.update(party.module.state_dict())
            assert got.keys() == ends[h].keys()
            for name, value in ends[h].items():
                assert torch.equal(got[name], value), f"hospital {h}: {name} differs"
            finals.append(got)
        # And what the next round would start from: the mean of the two.
        for name, value in means.items():
            assert torch.equal(mean([f[name] for f in finals]), value), name
        # That mean is the job's result, on both sides: each agent's final.safetensors
        # (the fronts) and the job's server checkpoint (the server segment).
        job.refresh_from_db()
        row = job.server_checkpoint
        assert (row.round_index, row.position, row.step) == (2, 0, 0), "the result's place"
        server = server_party(split, config)
        import_parties(
            read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server}
        )
        result = dict(server.module.state_dict())
        for h in range(2):
            final = agents.folder / f"agent-{h}" / "jobs" / f"job-{job.pk}" / "final.safetensors"
            deadline = time.monotonic() + 60
            while not final.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            clients = client_parties(split, config)
            import_parties(final.read_bytes(), clients)
            fronts = {k: v for p in clients.values() for k, v in p.module.state_dict().items()}
            assert fronts.keys().isdisjoint(result.keys())
            result_h = {**result, **fronts}
            assert result_h.keys() == means.keys()
            for name, value in means.items():
                assert torch.equal(result_h[name], value), f"hospital {h}'s result: {name}"
    finally:
        # The agents poll the live server until stopped: stop them while it knows the mode.
        processes.stop_all()  # together: the slowest shutdown, not their sum
        MODES.clear()
        MODES.update(saved)
