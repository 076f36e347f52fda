"""The workers' own Prometheus metrics, against real turns (real Redis, real database):

* in this process: the turn runner counts steps, bytes, runs and step times into the
  registry, and they agree with what the turns recorded in the database;
* a real Celery worker with the prefork pool serves them on MEDSPLIT_WORKER_METRICS_PORT,
  adding up its pool process's values (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
import uuid

import pytest
from django.db.models import Sum
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernel.actors import Actor
from tests.redis_server import forget_jobs
from tests.workers.hospitals import Hospitals, local_data, report_sizes
from tests.workers.processes import Processes, free_port, processes, wait_until
from training import services
from training.models import Job, Turn
from training.scheduling import job_advance
from training.states import JobState
from workers import turn_runner
from workers.metrics import forget_dead_processes

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["processes"]

STEPS = 4  # per turn; three hospitals, one round


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples by name and labels, read with Prometheus' own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


SERIES = [
    ("medsplit_worker_steps_total", {}),
    ("medsplit_worker_cut_bytes_total", {"direction": "up"}),
    ("medsplit_worker_cut_bytes_total", {"direction": "down"}),
    ("medsplit_worker_turn_runs_total", {"outcome": "completed"}),
    ("medsplit_worker_turn_runs_total", {"outcome": "error"}),
    ("medsplit_worker_step_seconds_count", {}),
    ("medsplit_worker_turns_in_progress", {}),
]


def snapshot(samples: dict) -> dict[str, float]:
    return {f"{n}{sorted(labels.items())}": value(samples, n, **labels) for n, labels in SERIES}


def scheduled_job(make_job, admin_actor: Actor) -> Job:
    job = make_job(seed=uuid.uuid4().int % 1000, rounds=1, max_steps_per_turn=STEPS)
    # Before a worker can claim a turn: it checks the hospital's frames against these.
    report_sizes(job, local_data(job, 16 * STEPS), local_data(job, 16))
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)


def recorded(job: Job) -> dict[str, int]:
    return Turn.objects.filter(job=job).aggregate(up=Sum("bytes_up"), down=Sum("bytes_down"))


def assert_counted(before: dict, after: dict, job: Job) -> None:
    """What three completed turns of STEPS steps each add to a worker's metrics."""
    delta = {k: after[k] - before[k] for k in after}
    db = recorded(job)
    assert delta["medsplit_worker_steps_total[]"] == 3 * STEPS
    assert delta["medsplit_worker_turn_runs_total[('outcome', 'completed')]"] == 3
    assert delta["medsplit_worker_turn_runs_total[('outcome', 'error')]"] == 0
    # The first step of each run is not timed (it waits for the hospital to connect).
    assert delta["medsplit_worker_step_seconds_count[]"] == 3 * (STEPS - 1)
    assert after["medsplit_worker_turns_in_progress[]"] == 0
    # Up: every byte the turns recorded. Down: those, and the "done" frame sent after the
    # turn's end was recorded.
    assert delta["medsplit_worker_cut_bytes_total[('direction', 'up')]"] == db["up"] > 0
    assert delta["medsplit_worker_cut_bytes_total[('direction', 'down')]"] > db["down"] > 0


def test_the_turn_runner_counts_what_it_serves(
    settings, tmp_path, redis_url: str, make_job, admin_actor: Actor
) -> None:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "TURN_SILENCE_SECONDS": 20.0,
        "METRICS_MIN_INTERVAL_SECONDS": 0.0,
    }
    job = scheduled_job(make_job, admin_actor)
    try:
        before = snapshot(parse(generate_latest(REGISTRY).decode()))
        hospitals = Hospitals(
            job, redis_url, local_data(job, 16 * STEPS), local_data(job, 16)
        ).start()
        outcomes = []
        while (turn := job_advance(job_id=job.pk)) is not None:
            outcomes.append(turn_runner.run(turn.pk, runner="metrics-test").outcome)
        hospitals.join(30)
        assert outcomes == ["completed"] * 3
        after = snapshot(parse(generate_latest(REGISTRY).decode()))
        assert_counted(before, after, job)
    finally:
        forget_jobs(redis_url, [job.pk])


@pytest.mark.slow
def test_a_prefork_worker_serves_its_pool_processes_metrics(
    processes: Processes, make_job, admin_actor: Actor, redis_url: str
) -> None:
    port = free_port()
    processes.env.update(
        MEDSPLIT_WORKER_METRICS_PORT=str(port), MEDSPLIT_WORKER_METRICS_ADDRESS="127.0.0.1"
    )
    processes.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    worker = processes.celery_worker("worker", pool=("--pool=prefork", "--concurrency=1"))
    processes.celery_beat()

    def scrape() -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return parse(r.read().decode())
        except OSError:
            return None

    before = snapshot(wait_until("the worker's metrics port", scrape, 120, processes))
    assert before["medsplit_worker_steps_total[]"] == 0  # every series there from the start

    job = scheduled_job(make_job, admin_actor)
    hospitals = Hospitals(job, redis_url, local_data(job, 16 * STEPS), local_data(job, 16)).start()

    def ended() -> str:
        job.refresh_from_db()
        return job.state if job.state in (JobState.COMPLETED, JobState.FAILED) else ""

    assert wait_until("the job to end", ended, 180, processes) == JobState.COMPLETED
    hospitals.join(30)
    # The turns ran in the pool's child process, the metrics come from the main one.
    log = (processes.folder / "worker.log").read_text(errors="replace")
    runners = {int(pid) for pid in re.findall(r"served by [^:\s]+:(\d+):", log)}
    assert runners and worker.pid not in runners, log[-3000:]
    assert_counted(before, snapshot(scrape()), job)


def test_a_killed_pool_process_stops_counting_as_in_progress(tmp_path) -> None:
    """Live gauges of processes that are gone are forgotten at the next scrape; those of
    living ones are kept, and other metrics' files are never touched."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    files = [
        f"gauge_livesum_{gone.pid}.db",
        f"gauge_livesum_{os.getpid()}.db",
        f"counter_{gone.pid}.db",
    ]
    for name in files:
        (tmp_path / name).write_bytes(b"")
    forget_dead_processes(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files[1:])
