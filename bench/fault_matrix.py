"""The fault matrix that ``bench_faults.py`` runs: one three-hospital job per fault, with
real processes, each case appending one JSON line to ``$MEDSPLIT_FAULTS_OUT``.

A pytest module (the platform's live server, database and process fixtures come from the
test suite), outside ``tests/`` so that the suite never collects it: the suite runs one
case of each fault (``tests/workers/test_relay_restart_agents.py``, ``test_link_cut.py``,
``test_celery_processes.py``, the killed-agent end-to-end test); the whole table is here.

Every case runs the same job (small_cnn, vanilla, 3 hospitals of 9 steps, one round,
checkpoints every 3 steps, the same seed and data) with two Celery workers and beat, and
injects its fault into the second hospital's turn. It measures:

* **steps recomputed**: activation frames the hospitals wrote on the relay (counted from
  ``MONITOR``), less the job's steps;
* **steps applied twice**: the server's Adam step count in its final checkpoint, less the
  job's steps (Adam counts every update it applied; goal 0);
* **seconds lost**: the job's time from scheduling to completion, less the undisturbed
  case's in the same run;
* whether the final weights (server and every hospital) equal the undisturbed run's and
  unsplit training's (``torch.equal``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import torch
from bench_faults import FAULTS
from django import db
from django.core.cache import cache

from medsplit.protocol.handoff import import_parties
from medsplit.training.reference import train_unsplit
from medsplit.training.setup import client_parties, server_party
from medsplit.training.verify import deterministic
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.conftest import _fresh_cache, _relay_prefix_of_this_session
from tests.workers.agents import (
    Agents,
    FrameTaken,
    Relay,
    RelayTrigger,
    command_on,
    frame_written,
    frozen,
    running,
    small_job,
    wait_completed,
)
from tests.workers.conftest import (
    _fast_passwords,
    _flushable_audit_log,
    admin_actor,
    consortium_admin,
    redis_url,
)
from tests.workers.processes import Processes, processes, workers_relay_user
from training.models import Job, Turn
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

pytestmark = [pytest.mark.django_db(transaction=True)]

__all__ = [
    "_fast_passwords",
    "_flushable_audit_log",
    "_fresh_cache",
    "_relay_prefix_of_this_session",
    "admin_actor",
    "consortium_admin",
    "processes",
    "redis_url",
]

#: The same job in every case, so that their weights can be compared.
SEED = 7
HOSPITALS = 3
CHECKPOINT_EVERY = 3
#: The step of the second hospital's turn around which a fault lands.
STEP = 4
#: The undisturbed case's results, for the others to compare with (it runs first).
_UNDISTURBED: dict[str, object] = {}


def selected() -> list[str]:
    wanted = os.environ.get("MEDSPLIT_FAULTS", "").split()
    return [f for f in FAULTS if not wanted or f in wanted or f == "none"]


#: A frame's step in its metadata, as MONITOR prints it (quotes escaped).
STEP_FIELD = re.compile(rb'\\"step\\":\\"(\d+)\\"')


@dataclass(frozen=True)
class Seen:
    """One activation frame on the relay: when, whose, which step."""

    at: float
    hospital: str
    step: int


class FrameCounter:
    """Notes the activation frames hospitals append to the relay (``MONITOR``), watching
    again at once when the relay comes back from a restart."""

    def __init__(self, url: str, hospitals: list[str]) -> None:
        self.url = url
        self.hospitals = hospitals
        self.seen: list[Seen] = []
        self._stop = threading.Event()
        self._match = frame_written("activations", ":train:up")
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            client = redis.Redis.from_url(self.url, socket_timeout=None, protocol=2)
            try:
                conn = client.connection_pool.get_connection()
                conn.send_command("MONITOR")
                conn.read_response()
                while not self._stop.is_set():
                    line = conn.read_response()
                    if isinstance(line, bytes) and self._match(line):
                        self._note(line)
            except (redis.RedisError, OSError):
                time.sleep(0.01)  # the relay is restarting
            finally:
                client.close()

    def _note(self, line: bytes) -> None:
        at = time.monotonic()
        head = line[:400]
        whose = next((h for h in self.hospitals if f":hospital:{h}:".encode() in head), "")
        step = STEP_FIELD.search(line)
        self.seen.append(Seen(at, whose, int(step.group(1)) if step else -1))

    def stop(self) -> list[Seen]:
        self._stop.set()
        return self.seen


def recovery(seen: list[Seen], ended: float, hospital: str) -> float | None:
    """Seconds from the fault's end to training under way again: the disturbed
    hospital's first frame after it that repeats a step it had sent (the turn resumed from
    its checkpoint), else its first frame after it, else anyone's (its turn was over)."""
    before = [s.step for s in seen if s.hospital == hospital and s.at <= ended]
    after = [s for s in seen if s.at > ended]
    mine = [s for s in after if s.hospital == hospital]
    again = [s for s in mine if before and s.step <= max(before)]
    first = (again or mine or after or [None])[0]
    return None if first is None else first.at - ended


def final_state(job: Job, agents: Agents) -> tuple[list[dict[str, torch.Tensor]], int]:
    """Every hospital's whole final model (the server's segment and its own), and the
    number of updates the server's Adam applied."""
    job.refresh_from_db()
    config = job.training_config()
    split = job_model(job).split(config)
    server = server_party(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    adam_steps = {int(s["step"]) for s in server.optimizer.state_dict()["state"].values()}
    assert len(adam_steps) == 1, adam_steps
    states = []
    for i in range(len(agents.hospitals)):
        clients = client_parties(split, config)
        import_parties(agents.final(job, i).read_bytes(), clients)
        state = {k: v.clone() for k, v in server.module.state_dict().items()}
        for party in clients.values():
            state.update(party.module.state_dict())
        states.append(state)
    return states, adam_steps.pop()


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def unsplit(job: Job, agents: Agents) -> dict[str, torch.Tensor]:
    config = job.training_config()
    model = job_model(job)
    with deterministic():
        return dict(
            train_unsplit(model.build(), agents.trains(job), config, model.split(config))
            .state_dict()
            .items()
        )


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    folder = tmp_path / "relay"
    folder.mkdir()
    with running(Relay(folder)) as made:
        yield made


@pytest.fixture
def consortium(live_server, settings, relay: Relay, processes: Processes) -> str:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": relay.url,
        "WORKER_REDIS_URL": relay.url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
    }
    processes.env.update(
        REDIS_URL=relay.url,
        CELERY_BROKER_URL=relay.url,
        MEDSPLIT_CHECKPOINT_EVERY=str(CHECKPOINT_EVERY),
    )
    cache.clear()
    return live_server.url


def record(result: dict[str, object]) -> None:
    out = os.environ.get("MEDSPLIT_FAULTS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")


def measure(
    fault: str,
    processes: Processes,
    relay_url: str,
    agents: Agents,
    admin,
    inject: Callable[[Job, list[float]], Callable[[], None] | None],
) -> dict[str, object]:
    """Run the job with ``inject(job, ended)`` arranging the fault (and returning what to
    do once it fired, in this thread; whoever ends the fault appends the time to
    ``ended``); measure it."""
    ended: list[float] = []
    slugs = [h.slug for h in agents.hospitals]
    counter = FrameCounter(relay_url, slugs)
    began = time.monotonic()
    job = small_job(admin, agents.hospitals, seed=SEED, max_retries=3)
    after = inject(job, ended)
    if after is not None:
        after()
    wait_completed(processes, job, agents, 480)
    took = time.monotonic() - began
    time.sleep(0.5)  # the last frames' MONITOR lines
    seen = counter.stop()
    written = len(seen)
    recovered = recovery(seen, ended[0], slugs[1]) if ended else None
    turns = Turn.objects.filter(job=job)
    steps = sum(turns.filter(status="completed").values_list("steps", flat=True))
    states, adam_steps = final_state(job, agents)
    want = unsplit(job, agents)
    undisturbed = _UNDISTURBED.get("states")
    result: dict[str, object] = {
        "fault": fault,
        "steps": steps,
        "checkpoint_every": CHECKPOINT_EVERY,
        "recomputed": written - steps,
        "applied_twice": adam_steps - steps,
        "seconds": round(took, 2),
        # From the fault's end (a process killed, the relay back, the link back) to the
        # next activation frame: training under way again.
        "recovery_s": None if recovered is None else round(recovered, 2),
        "handoffs_put_back": sum(
            processes.folder.joinpath(f"agent-{i}.log").read_text().count("put back the")
            for i in range(len(agents.hospitals))
        ),
        "runner_starts": sum(turns.values_list("runs", flat=True)),
        "failed_turns": turns.exclude(status="completed").count(),
        "equal_unsplit": all(equal(s, want) for s in states),
        "equal_undisturbed": (
            None
            if undisturbed is None
            else all(equal(s, u) for s, u in zip(states, undisturbed, strict=True))
        ),
    }
    if fault == "none":
        _UNDISTURBED.update(states=states, seconds=took)
    else:
        base = _UNDISTURBED.get("seconds")
        result["seconds_lost"] = None if base is None else round(took - float(base), 2)
    return result


@pytest.mark.parametrize("fault", selected())
def test_fault(
    fault: str, processes: Processes, consortium: str, relay: Relay, tmp_path: Path, admin_actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, HOSPITALS)
    second = agents.hospitals[1]
    up = f":hospital:{second.slug}:"
    with workers_relay_user(relay.url, processes):
        processes.celery_worker("worker-1")
        processes.celery_worker("worker-2")
        processes.celery_beat()
        workers = [processes.started[n].pid for n in ("worker-1", "worker-2")]

        def restart(frozen_workers: bool, ended: list[float]) -> Callable[[], None]:
            def action() -> None:
                if not frozen_workers:
                    relay.restart()
                else:
                    with frozen(workers[0]), frozen(workers[1]):
                        relay.restart()
                ended.append(time.monotonic())

            return action

        def inject(job: Job, ended: list[float]) -> Callable[[], None] | None:
            if fault == "none":
                return None

            def kill_runner() -> None:
                # From the watching thread: its own database connection, closed after.
                turn = Turn.objects.filter(job=job, position=1).exclude(runner="").first()
                db.connection.close()
                os.kill(int(turn.runner.split(":")[1]), signal.SIGKILL)
                ended.append(time.monotonic())

            def kill_agent() -> None:
                processes.stop("agent-1", signal.SIGKILL)
                ended.append(time.monotonic())

            mid_step = FrameTaken("activations", up, step=STEP)
            matches, action, then = {
                "worker_sigkill": (mid_step, kill_runner, None),
                "agent_sigkill": (
                    mid_step,
                    kill_agent,
                    lambda: agents.start(1),
                ),
                "relay_handshake": (frame_written("sync", up), restart(False, ended), None),
                "relay_mid_step": (mid_step, restart(True, ended), None),
                "relay_between_steps": (
                    FrameTaken("gradients", up, step=STEP),
                    restart(False, ended),
                    None,
                ),
                "relay_handoff": (
                    command_on("SET", f"{second.slug}:{{job-{job.pk}}}:handoff"),
                    restart(False, ended),
                    None,
                ),
            }[fault]
            trigger = RelayTrigger(relay.url, matches, action)

            def fired() -> None:
                trigger.wait(f"the fault {fault}", 240, processes)
                if then is not None:
                    then()

            return fired

        result = measure(fault, processes, relay.url, agents, admin_actor, inject)
    record(result)
    assert result["equal_unsplit"], result
