"""Benchmark the hospital agent during a turn: its peak resident memory, and per step
the time it spends waiting on the relay against the time it spends computing.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``; the real per-hospital ACL users are made on it)::

    .venv/bin/python bench/bench_agent.py                  # a table
    .venv/bin/python bench/bench_agent.py --steps 25 --json

Everything is a real process, as in a deployment (and as in
``tests/hospital_agent/test_end_to_end.py``):

- the coordinator: ``manage.py runserver 127.0.0.1:<free port> --noreload`` on
  a temporary SQLite database (or ``DATABASE_URL`` when set) that this script migrates;
  ``MEDSPLIT_REDIS_ACL_PROVISIONER=hospitals.relay_acl.RedisAclUsers``, so enrolment
  makes the hospital's own Redis user ``hospital-<slug>``;
- a Celery worker (``--pool=solo``) and Celery beat on a unique queue; scheduling a job
  sends ``advance_job`` at once (``workers.dispatch.CeleryDispatcher``), the sweep runs
  every second;
- one agent, ``python -m hospital_agent run``, configured by ``MEDSPLIT_AGENT_*``
  variables: synthetic data (``--samples`` images of the input shape, by default
  exactly ``steps x batch``, no validation split), the one-time enrolment code from
  ``hospitals.services.hospital_register`` (a consortium admin made here), polling and
  heartbeats every second.

The script waits until the agent enrolled and reported its dataset summary, creates a
one-hospital, one-round job (DenseNet121 at its registry default cut, input 1x64x64,
batch 32, codec ``none``, vanilla, SGD with momentum on both sides,
``max_steps_per_turn = --steps``), schedules it, and waits until the job completed and
the agent logged its ``turn done`` line.

Measured, on the real agent process:

1. peak resident memory: ``VmHWM`` of ``/proc/<pid>/status`` once the turn is done
   (the kernel's high-water mark over the process's life: enrolment, data check and
   the turn), next to the peak the agent logs itself (``ru_maxrss``); a thread also
   samples ``VmRSS`` every ``--sample-ms`` (~50 ms), to show the resident memory while
   idle before the turn and the turn's increase over it. The goal is under 1 GiB.
2. per training step, the time waiting on the relay and the time computing, as the
   agent logs them (``ClientReport.waiting_seconds`` and
   ``total_seconds - waiting_seconds`` of the run, divided by its training steps). In
   vanilla mode "waiting" holds the server's forward and backward (the worker's
   compute) as well as the transfers and Redis; it also holds the handshake at the
   start of the turn (the worker building its segment), spread over the steps.

Every process runs ``--threads`` torch threads (2): ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` in every child's environment, and ``torch.set_num_threads`` in the
worker before Celery starts. At the end every process is stopped (SIGTERM, then
SIGKILL), the Redis keys made here are deleted (the queue's, ``_kombu.binding.<queue>``,
the hospital's streams and hand-offs) with the hospital's ACL user (``ACL DELUSER``),
and the temporary folder is removed (``--keep`` keeps it, with every process's log).

Nothing here asserts on time or memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from platform_setup import (
    REPO,
    WORKER_READY,
    add_model_args,
    add_run_args,
    clean_hospitals,
    configure,
    default_cut,
    job_data,
    log,
    make_admin,
    new_run,
    platform_run,
    print_result,
    read_log,
    shape_of,
    spawn,
    stop_processes,
    worker_command,
)
from report import table, today

GOAL_MIB = 1024.0
#: Issue 26: the agent's peak resident memory over the bare script's, and its start-up to
#: first heartbeat over the bare script's import time.
MEMORY_TARGET = 1.05
STARTUP_TARGET = 1.5
KiB = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="the job's max_steps_per_turn")
    add_model_args(parser)
    parser.add_argument(
        "--samples", type=int, default=None, help="synthetic images (default: steps x batch)"
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        help="the agent's validation split (default 0: training steps only)",
    )
    parser.add_argument("--sample-ms", type=float, default=50.0, help="VmRSS sampling")
    parser.add_argument(
        "--bare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run bench/bare_front.py (the same front, steps and batch in a bare "
        "script) just before the agent starts, for the memory and start-up ratios",
    )
    parser.add_argument(
        "--keep-freed-memory",
        choices=["default", "0", "1"],
        default="default",
        help="the agent's MEDSPLIT_KEEP_FREED_MEMORY (default: the agent's own default)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the turn")
    add_run_args(parser)
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- environment and processes ------------------------------------------------------------


def configure_agent(args: argparse.Namespace, folder: Path, tag: str) -> dict[str, str]:
    """Set this process's environment (read by the settings) and return the children's."""
    return configure(
        folder,
        args.redis_url,
        f"medsplit-bench-agent-{tag}",
        {
            "MEDSPLIT_REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
            "MEDSPLIT_SWEEP_SECONDS": "1",
            "OMP_NUM_THREADS": str(args.threads),
            "MKL_NUM_THREADS": str(args.threads),
        },
        {"PYTHONUNBUFFERED": "1"},
    )


@dataclass
class Processes:
    """The processes this script started, each logging to ``<folder>/<name>.log``, and
    the slug of the hospital whose agent is one of them."""

    folder: Path
    env: dict[str, str]
    slug: str
    started: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> int:
        process = spawn(args, env or self.env, self.log_path(name), append=True)
        self.started[name] = process
        return process.pid

    def log_path(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def text(self, name: str) -> str:
        return read_log(self.log_path(name))

    def check_alive(self) -> None:
        for name, process in self.started.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode})\n{self.tails()}")

    def stop_all(self, wait: float = 15.0) -> None:
        """Stop the agent first (it talks to the others), then the rest: SIGTERM, then
        SIGKILL for whatever is still running after ``wait`` seconds."""
        agent = {n: p for n, p in self.started.items() if n == "agent"}
        for group in (agent, {n: p for n, p in self.started.items() if n != "agent"}):
            stop_processes(group, wait, on_kill=lambda n: log(f"{n} ignored SIGTERM; killing it"))

    def tails(self, chars: int = 3000) -> str:
        return "\n".join(f"----- {n} -----\n{self.text(n)[-chars:]}" for n in self.started)


def wait_until(
    what: str, predicate, timeout: float, processes: Processes, every: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes.check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}\n{processes.tails()}")


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False
    return True


# -- memory of a process --------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes (empty once it is gone)."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, amount, _ = line.split()
                    values[name.rstrip(":")] = int(amount) * KiB
    except (OSError, ValueError):
        return {}
    return values


class RssSampler(threading.Thread):
    """Samples ``VmRSS`` of one process every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            rss = proc_status(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self.halt.wait(self.interval)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in self.samples if start <= t <= end]

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


def run_bare(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """``bench/bare_front.py`` for the same model, input, batch and steps, as a child
    with the agent's thread settings; its JSON line."""
    command = [
        sys.executable,
        str(REPO / "bench" / "bare_front.py"),
        "--model",
        args.model,
        "--input-shape",
        args.input_shape,
        "--batch-size",
        str(args.batch_size),
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"bare_front.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log(
        f"bare script: imports {result['import_s']:.1f} s, VmHWM {mib(result['vm_hwm'])}, "
        f"wall {result['wall_s']:.1f} s"
    )
    return result


# -- the coordinator's side -----------------------------------------------------------------


def create_job(args: argparse.Namespace, admin, slug: str, tag: str):
    from training import services

    data = job_data(
        name=f"bench-agent {tag}",
        model=args.model,
        batch_size=args.batch_size,
        steps=args.steps,
        slug=slug,
    )
    return services.job_create(actor=admin, data=data)


def job_state(job_id: int) -> str:
    from training.models import Job
    from training.states import JobState

    job = Job.objects.get(pk=job_id)
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        raise RuntimeError(f"job {job_id} is {job.state}: {job.state_reason}")
    return job.state


# -- the agent's log --------------------------------------------------------------------------

# Not anchored to a line's start: the agent's progress bar (tqdm, "\r") shares its lines.
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
_MY_TURN = re.compile(
    _STAMP + r"[^\r\n]*: my turn \((\d+) training steps, (\d+) validation batches\)", re.M
)
_DONE = re.compile(
    _STAMP
    + r"[^\r\n]*turn done: ([^\r\n]*); per step ([\d.]+) ms waiting on the relay, ([\d.]+) ms "
    r"computing; peak memory ([\d.]+) MiB",
    re.M,
)


def _stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")


def parse_agent_log(text: str) -> dict[str, Any]:
    done = _DONE.search(text)
    turn = _MY_TURN.search(text)
    if done is None or turn is None:
        raise RuntimeError("the agent's log has no 'my turn' or 'turn done' line")
    return {
        "line": "turn done: " + done.group(0).split("turn done: ", 1)[1],
        "metrics": done.group(2),
        "wait_ms": float(done.group(3)),
        "compute_ms": float(done.group(4)),
        "peak_mib": float(done.group(5)),
        "train_steps": int(turn.group(2)),
        "val_batches": int(turn.group(3)),
        "turn_wall_s": (_stamp(done.group(1)) - _stamp(turn.group(1))).total_seconds(),
        "turn_began": _stamp(turn.group(1)),
    }


# -- the run --------------------------------------------------------------------------------


def bench(args: argparse.Namespace, env: dict[str, str], procs: Processes, tag: str) -> dict:
    from django.conf import settings

    from hospitals import services as hospital_services
    from hospitals.models import Hospital
    from training.models import Turn
    from training.states import JobState

    shape = shape_of(args.input_shape)
    samples = args.samples or args.steps * args.batch_size
    admin = make_admin(f"bench-agent-{tag}")
    slug = procs.slug
    registration = hospital_services.hospital_register(
        actor=admin, name=f"Bench agent {tag}", slug=slug
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manage = str(REPO / "manage.py")
    procs.start(
        "coordinator",
        [sys.executable, manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
    )
    queue = env["MEDSPLIT_CELERY_QUEUE"]
    worker_pid = procs.start(
        "worker",
        worker_command(args.threads, queue, f"bench-agent-{tag}"),
    )
    procs.start(
        "beat",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.celery_app",
            "beat",
            "-s",
            str(procs.folder / "beat-schedule"),
            "--pidfile",
            str(procs.folder / "beat.pid"),
            "-l",
            "INFO",
        ],
    )
    wait_until("the coordinator to answer", lambda: answers(url + "/"), 120, procs)
    log(f"coordinator at {url}")
    # The worker's start (building torch and MONAI) is over before the bare script and
    # the agent start, so neither competes with it for the CPUs.
    wait_until("the worker to be ready", lambda: WORKER_READY in procs.text("worker"), 180, procs)
    log("worker ready")
    bare = run_bare(args, env) if args.bare else None
    agent_env = {
        **env,
        "MEDSPLIT_AGENT_COORDINATOR_URL": url,
        "MEDSPLIT_AGENT_WORK_DIR": str(procs.folder / "agent"),
        "MEDSPLIT_AGENT_ENROLMENT_CODE": registration.enrolment_code.plaintext,
        "MEDSPLIT_AGENT_DATA_KIND": "synthetic",
        "MEDSPLIT_AGENT_DATA_SAMPLES": str(samples),
        "MEDSPLIT_AGENT_DATA_SHAPE": ",".join(map(str, shape)),
        "MEDSPLIT_AGENT_DATA_NUM_CLASSES": "2",
        "MEDSPLIT_AGENT_DATA_SEED": str(int(tag, 16) % 10_000),
        "MEDSPLIT_AGENT_DATA_VAL_FRACTION": str(args.val_fraction),
        "MEDSPLIT_AGENT_POLL_SECONDS": "1",
        "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "1",
        "MEDSPLIT_AGENT_REPLY_TIMEOUT": "300",
    }
    if args.keep_freed_memory != "default":
        agent_env["MEDSPLIT_KEEP_FREED_MEMORY"] = args.keep_freed_memory
    agent_started = time.monotonic()
    agent_pid = procs.start("agent", [sys.executable, "-m", "hospital_agent", "run"], agent_env)
    sampler = RssSampler(agent_pid, args.sample_ms / 1000)
    sampler.start()
    wait_until(
        "the agent to enrol and report its data",
        lambda: (
            Hospital.objects.filter(slug=slug, status=Hospital.Status.ENROLLED)
            .exclude(dataset_summary={})
            .exists()
        ),
        180,
        procs,
        every=0.05,
    )
    # The dataset summary arrives with the agent's first heartbeat: start-up (imports,
    # enrolment, identity, data check) to first heartbeat, polled every 50 ms.
    first_heartbeat_s = time.monotonic() - agent_started
    log(f"agent (pid {agent_pid}) enrolled as {slug}; first heartbeat {first_heartbeat_s:.1f} s")
    time.sleep(2.0)  # the agent's idle resident memory, after its first polls
    idle_from = time.monotonic() - 1.5
    job = create_job(args, admin, slug, tag)
    scheduled, scheduled_at = time.monotonic(), datetime.now()
    load_before = os.getloadavg()[0]
    from training import services

    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin)
    log(f"job {job.pk} scheduled ({args.model}, {args.steps} steps); waiting for the turn")
    wait_until(
        "the job to complete",
        lambda: job_state(job.pk) == JobState.COMPLETED,
        args.timeout,
        procs,
    )
    wait_until("the agent's 'turn done' line", lambda: _DONE.search(procs.text("agent")), 60, procs)
    ended = time.monotonic()
    load_after = os.getloadavg()[0]
    time.sleep(0.3)
    status = proc_status(agent_pid)
    worker_status = proc_status(worker_pid)
    sampler.stop()
    log(f"job {job.pk} completed")
    agent = parse_agent_log(procs.text("agent"))
    # From scheduling the job to the agent's "my turn": the worker's start of the turn
    # (its segment built) and the agent's (data, model, snapshot) before any step.
    agent["start_s"] = (agent.pop("turn_began") - scheduled_at).total_seconds()
    turn = Turn.objects.get(job=job)
    idle = sampler.between(idle_from, scheduled)
    during = sampler.between(scheduled, ended)
    return {
        "command": shlex.join(sys.orig_argv),
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": __import__("torch").__version__,
        "python": platform.python_version(),
        "threads": args.threads,
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "model": args.model,
        "cut": default_cut(args.model),
        "input_shape": list(shape),
        "batch_size": args.batch_size,
        "samples": samples,
        "val_fraction": args.val_fraction,
        "max_steps_per_turn": args.steps,
        "job": job.pk,
        "turn_steps": turn.steps,
        "bytes_per_step": (turn.bytes_up + turn.bytes_down) / max(turn.steps, 1),
        "agent_pid": agent_pid,
        "agent": agent,
        "vm_hwm": status.get("VmHWM"),
        "vm_rss_end": status.get("VmRSS"),
        "rss_idle": max(idle) if idle else None,
        "rss_peak_sampled": max(during) if during else None,
        "rss_samples": len(during),
        "sample_ms": args.sample_ms,
        "worker_vm_hwm": worker_status.get("VmHWM"),
        # Other work on the machine slows both sides of the turn: the 1-minute load
        # average when the job was scheduled and when the turn was done.
        "load_average": [load_before, load_after],
        "cpus": os.cpu_count(),
        "goal_mib": GOAL_MIB,
        "goal_met": status.get("VmHWM", 1 << 62) / (1 << 20) < GOAL_MIB,
        "keep_freed_memory": args.keep_freed_memory,
        "first_heartbeat_s": first_heartbeat_s,
        "bare": bare,
        # Issue 26's targets: the agent's peak at most 1.05 x the bare script's, and its
        # start-up to first heartbeat at most 1.5 x the bare script's import time.
        "memory_ratio": (status["VmHWM"] / bare["vm_hwm"]) if bare and "VmHWM" in status else None,
        "startup_ratio": (first_heartbeat_s / bare["import_s"]) if bare else None,
    }


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):,.0f} MiB"


def show(r: dict[str, Any]) -> None:
    a = r["agent"]
    print(f"command: {r['command']}")
    print(
        f"torch {r['torch']}, Python {r['python']}, {r['threads']} torch threads in every "
        f"process, database {r['database']}; 1-minute load average "
        f"{r['load_average'][0]:.2f} at scheduling, {r['load_average'][1]:.2f} at the end "
        f"({r['cpus']} CPUs)"
    )
    print(
        f"{r['model']} cut after {r['cut']}, input {'x'.join(map(str, r['input_shape']))}, "
        f"batch {r['batch_size']}, codec none, vanilla; {r['samples']} synthetic images, "
        f"validation fraction {r['val_fraction']:g}; max_steps_per_turn {r['max_steps_per_turn']}"
    )
    print(f"agent log: {a['line']}")
    rows = [
        ("training steps (agent / coordinator)", f"{a['train_steps']} / {r['turn_steps']}"),
        ("validation batches", str(a["val_batches"])),
        ("per step: waiting on the relay", f"{a['wait_ms']:.1f} ms"),
        ("per step: computing", f"{a['compute_ms']:.1f} ms"),
        (
            "waiting share",
            f"{100 * a['wait_ms'] / max(a['wait_ms'] + a['compute_ms'], 1e-9):.0f} %",
        ),
        ("turn wall time (agent log: my turn .. done)", f"{a['turn_wall_s']:.1f} s"),
        ("job scheduled .. agent's 'my turn'", f"{a['start_s']:.1f} s"),
        ("bytes on the relay per step", f"{r['bytes_per_step']:,.0f}"),
        ("agent VmHWM at the end (/proc)", mib(r["vm_hwm"])),
        ("agent peak, its own log (ru_maxrss)", f"{a['peak_mib']:,.0f} MiB"),
        (f"agent VmRSS peak, sampled every ~{r['sample_ms']:g} ms", mib(r["rss_peak_sampled"])),
        ("agent VmRSS idle before the turn", mib(r["rss_idle"])),
        ("agent VmRSS after the turn", mib(r["vm_rss_end"])),
        ("worker VmHWM (for reference)", mib(r["worker_vm_hwm"])),
    ]
    for name, value in rows:
        print(f"  {name:<44} {value:>16}")
    if r["bare"]:
        b = r["bare"]
        print(
            f"  bare script (bench/bare_front.py): imports {b['import_s']:.2f} s, VmRSS after "
            f"imports {mib(b['rss_after_import'])}, VmHWM {mib(b['vm_hwm'])}"
        )
        print(
            f"  agent / bare VmHWM: {r['memory_ratio']:.3f} (target <= {MEMORY_TARGET}); "
            f"agent first heartbeat {r['first_heartbeat_s']:.2f} s / bare imports: "
            f"{r['startup_ratio']:.2f} (target <= {STARTUP_TARGET})"
        )
    verdict = "met" if r["goal_met"] else "NOT met"
    print(f"  peak under {r['goal_mib']:g} MiB (1 GiB): {verdict}")


def markdown(r: dict[str, Any]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    a = r["agent"]
    share = 100 * a["wait_ms"] / max(a["wait_ms"] + a["compute_ms"], 1e-9)
    load = " → ".join(f"{x:.1f}" for x in r["load_average"])
    return (
        table(
            [
                f"run ({today()})",
                "waiting / computing per step",
                "waiting share",
                "agent `VmHWM`",
                "`VmRSS` idle before turn → peak (sampled)",
                "worker `VmHWM`",
                f"turn wall ({r['turn_steps']} steps)",
                f"load avg ({r['cpus']} CPUs)",
                f"< {r['goal_mib']:g} MiB",
            ],
            [
                [
                    f"{r['model']} {'x'.join(map(str, r['input_shape']))} b{r['batch_size']}",
                    f"{a['wait_ms']:.1f} / {a['compute_ms']:.1f} ms",
                    f"{share:.0f} %",
                    mib(r["vm_hwm"]),
                    f"{mib(r['rss_idle'])} → {mib(r['rss_peak_sampled'])}",
                    mib(r["worker_vm_hwm"]),
                    f"{a['turn_wall_s']:.1f} s",
                    load,
                    "**yes**" if r["goal_met"] else "**no**",
                ]
            ],
        )
        + f"\n\nThe agent's own log line: `{a['line']}`."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tag, folder = new_run("agent")
    env = configure_agent(args, folder, tag)
    procs = Processes(folder, env, slug=f"bench-agent-{tag}")
    log(f"setting up in {folder} (queue {env['MEDSPLIT_CELERY_QUEUE']})")
    with platform_run(
        folder,
        keep=args.keep,
        tails=procs.tails,
        stop=procs.stop_all,
        clean_redis=lambda: clean_hospitals(
            args.redis_url, env["MEDSPLIT_CELERY_QUEUE"], [procs.slug] if procs.slug else []
        ),
    ):
        result = bench(args, env, procs, tag)
    print_result(result, args.json, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
