"""Benchmark scaling with the number of hospitals: wall time of one round with 1, 3 and 10
hospitals, each a real agent process, and what a turn costs besides its training steps.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``; the real per-hospital ACL users are made on it)::

    .venv/bin/python bench/bench_scaling.py                    # a table
    .venv/bin/python bench/bench_scaling.py --hospitals 1 3 --steps 5 --rounds 1 --json

The platform runs as real processes, as ``bench_agent.py`` sets it up (with its helpers
and those of ``platform_setup.py``): the coordinator (``manage.py runserver``) on a
temporary SQLite database (or ``DATABASE_URL``), a Celery worker (``--pool=solo``) and
Celery beat (sweep every 5 s, the coordinator's default) on a unique queue, and as many
hospital agents (``python -m hospital_agent run``, each enrolled with its own one-time
code and Redis ACL user) as the largest configuration has hospitals. Agent ``i`` holds
its own tenth (``1 / max(--hospitals)``) of PneumoniaMNIST's training split from
``../shared/data`` (about 470 images 1x28x28; synthetic images of that count where the
file is absent), no validation split. The agents are started once and stay up; the
configuration with ``n`` hospitals uses agents ``0 .. n-1`` (so the idle agents of the
smaller configurations still poll the coordinator, as they would in a consortium).

For each configuration (``--hospitals``, default 1 3 10) one job: ``small_cnn`` at its
default cut ``pool1``, input 1x28x28, batch 32, vanilla, codec ``none``, SGD with
momentum on both sides, exactly ``--steps`` training steps per turn (``max_steps_per_turn``,
with enough local epochs), so every turn does the same work; ``--rounds`` (2) rounds.
Turns are round-robin: a round is every hospital's turn in order, each handing its
sealed weights to the next. Before them a warm-up job, not reported, gives every agent
one 2-step turn (the worker and each agent trace the model and load their data once per
process).

Measured, from the coordinator's database and the agents' logs (same machine, same
clock):

- round wall time: the round's ``started_at`` to ``finished_at`` (the coordinator opens
  the round with its first turn and closes it when the worker moves the job on after the
  last turn); per turn: that divided by the hospitals; growth: the ratio to the
  1-hospital round (linear growth is a ratio of ``n``, so ratio / n is 1).
- per turn (mean over the measured turns), phases that add up to the turn's period
  (from its start to the next turn's start): *pick-up*, the turn's ``started_at`` to the
  agent's ``my turn`` log line (the agent's long poll answering, then getting its start
  state: waiting until the previous hospital has recorded its sealed hand-off, fetching
  and opening it); *steps*, ``--steps`` times the median step time (the agent's progress
  bar stamps each step, as in ``bench_overhead.py``); *handshake and end*, the rest of
  the time to the turn's ``finished_at`` (the server's handshake and, after the last
  step, the final snapshot and the turn's end, recorded by the worker); *scheduling*,
  ``finished_at`` to the next turn's ``started_at`` (the worker's follow-up task
  starting the next turn). Also shown: *sealing*, the agent's ``turn done`` to its
  ``weights sealed`` lines (sealing its weights for each of the other ``n - 1``
  hospitals and recording each hand-off with the coordinator), which overlaps the next
  turn's pick-up.
- the hand-over, per pair of consecutive turns of a job (across rounds too): from the
  previous hospital's last training step answered to the next one's first step answered,
  in phases (:func:`handover_phases`: the worker's end of the turn; the follow-up task and
  the coordinator's state change; the next agent's long-poll answer; fetching and opening
  the sealed hand-off; data and segment set-up; the handshake and first step), beside the
  job's median step and their ratio; and the time from ``job_create`` to the first step
  answered, on processes already warm (the warm-up job).
- each agent's resident memory (``VmRSS`` and ``VmHWM`` of ``/proc/<pid>/status``) at
  the end.

As a deployment runs them (``docker-compose.yml``), a scheduled job is sent to the worker
at once (``MEDSPLIT_JOB_DISPATCHER=workers.dispatch.CeleryDispatcher``) and every process
shares the run's Redis as its cache (``MEDSPLIT_CACHE_URL``: the long-polls' wake-up);
the coordinator holds every agent's long-poll at once (``MEDSPLIT_LONG_POLLS_PER_PROCESS``
above the agent count, as ``docs/deploy.md`` sizes a deployment).

Every process runs ``--threads`` torch threads (2; ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
in each child, ``torch.set_num_threads`` in the worker). Jobs are numbered from a large
number drawn for the run (the relay's keys carry the job id). At the end every process
is stopped, the Redis keys made here and the hospitals' ACL users are deleted, and the
temporary folder is removed (``--keep`` keeps it with the processes' logs).

Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_agent import _DONE, _STAMP, Processes, proc_status, wait_until
from platform_setup import (
    REPO,
    WORKER_READY,
    add_run_args,
    clean_hospitals,
    configure_platform,
    job_data,
    log,
    make_admin,
    new_run,
    platform_run,
    print_result,
    register_hospital,
    start_agent,
    start_platform,
    step_stamps,
    stop_platform,
    unique_job_ids,
    wait_enrolled,
    wait_job,
)
from report import table, today

DATA = REPO.parent / "shared" / "data" / "pneumoniamnist_28_reconstructed.npz"
MiB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hospitals", type=int, nargs="+", default=[1, 3, 10], help="configurations"
    )
    parser.add_argument("--steps", type=int, default=10, help="training steps per turn")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per job")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    add_run_args(parser)
    args = parser.parse_args(argv)
    if min(args.hospitals) < 1 or args.steps < 2 or args.rounds < 1:
        parser.error("need hospitals >= 1, steps >= 2, rounds >= 1")
    return args


# -- data -----------------------------------------------------------------------------------


def write_parts(folder: Path, parts: int) -> tuple[list[Path], str]:
    """PneumoniaMNIST's training split cut in ``parts`` MedMNIST-format files (synthetic
    images of the same count and format where the file is absent); the source's name."""
    import numpy as np
    import torch

    if DATA.exists():
        archive = dict(np.load(DATA, allow_pickle=False))
        source = f"PneumoniaMNIST ({DATA.name}), train split"
    else:
        from medsplit.data import synthetic_split

        data = synthetic_split(4708, shape=(1, 28, 28), seed=5)
        images = (data.images[:, 0].clamp(0, 1) * 255).round().to(torch.uint8)
        archive = {"train_images": images.numpy(), "train_labels": data.labels.numpy()}
        source = f"synthetic (no {DATA})"
    images, labels = archive["train_images"], archive["train_labels"]
    paths = []
    for i in range(parts):
        path = folder / f"part-{i}.npz"
        part = {"train_images": images[i::parts], "train_labels": labels[i::parts]}
        for split in ("val", "test"):  # the format's other splits, unused here
            part[f"{split}_images"], part[f"{split}_labels"] = images[:1], labels[:1]
        np.savez(path, **part)
        paths.append(path)
    return paths, source


# -- the agents' logs -----------------------------------------------------------------------

_MY_TURN = re.compile(_STAMP + r"[^\r\n]*: job (\d+) round (\d+): my turn", re.M)
_ASSIGNED = re.compile(_STAMP + r"[^\r\n]*: job (\d+) round (\d+): turn \d+ assigned", re.M)
_READY = re.compile(_STAMP + r"[^\r\n]*: job (\d+) round (\d+): start state ready", re.M)
_SEALED = re.compile(_STAMP + r"[^\r\n]*: job (\d+): weights sealed for (\d+) other", re.M)


def _when(text: str) -> datetime:
    """An agent log's local time stamp as an aware time."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)


def agent_turns(text: str) -> dict[tuple[int, int], dict[str, Any]]:
    """Per (job, round) in an agent's log: its ``turn assigned``, ``start state ready``
    (``None`` where the agent logs none), ``my turn``, ``turn done`` and ``weights sealed``
    times and its step stamps (seconds since the turn's progress bar began, which is
    made just after ``start state ready``)."""
    turns = list(_MY_TURN.finditer(text))
    bars = step_stamps(text)
    if len(bars) != len(turns):
        raise RuntimeError(f"{len(turns)} turns but {len(bars)} progress bars in an agent's log")
    found = {}
    for index, (turn, bar) in enumerate(zip(turns, bars, strict=True)):
        end = turns[index + 1].start() if index + 1 < len(turns) else len(text)
        segment = text[turn.start() : end]
        done, sealed = _DONE.search(segment), _SEALED.search(segment)
        if done is None or sealed is None:
            raise RuntimeError(f"job {turn.group(2)} round {turn.group(3)}: turn not finished")
        key = int(turn.group(2)), int(turn.group(3))
        # The last of each before "my turn" (a turn that could not start logs them again).
        before = text[: turn.start()]
        assigned = [m for m in _ASSIGNED.finditer(before) if (int(m[2]), int(m[3])) == key]
        ready = [m for m in _READY.finditer(before) if (int(m[2]), int(m[3])) == key]
        found[key] = {
            "assigned": _when(assigned[-1].group(1)) if assigned else None,
            "ready": _when(ready[-1].group(1)) if ready else None,
            "my_turn": _when(turn.group(1)),
            "done": _when(done.group(1)),
            "sealed": _when(sealed.group(1)),
            "recipients": int(sealed.group(3)),
            "stamps": bar,
        }
    return found


# -- one configuration ----------------------------------------------------------------------


def run_job(
    args: argparse.Namespace,
    procs: Processes,
    admin,
    slugs: list[str],
    tag: str,
    samples: int,
    *,
    steps: int,
    rounds: int,
) -> dict[str, Any]:
    """One job over ``slugs`` in order; its rounds and per-turn phases."""
    from training import services
    from training.models import Round, Turn
    from training.states import JobState

    n = len(slugs)
    data = job_data(
        name=f"bench-scaling {tag} {n} hospitals, {steps} steps, {time.time():.3f}",
        model=args.model,
        batch_size=args.batch_size,
        steps=steps,
        slug=slugs[0],
    )
    data["participants"] = [{"hospital": slug} for slug in slugs]
    data["rounds"] = rounds
    data["local_epochs"] = math.ceil(steps * args.batch_size / samples)
    created = datetime.now(UTC)
    job = services.job_create(actor=admin, data=data)
    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin)
    log(f"{n} hospital(s): job {job.pk} scheduled ({data['rounds']} rounds); waiting")
    wait_job(procs, job.pk, args.timeout)
    agents = [f"agent-{i}" for i in range(n)]
    wait_until(
        "the agents' 'weights sealed' lines",
        lambda: all(
            len(re.findall(rf"job {job.pk}: weights sealed", procs.text(a))) == data["rounds"]
            for a in agents
        ),
        60,
        procs,
    )
    logs = {}
    for position, agent in enumerate(agents):
        for (job_id, round_), turn in agent_turns(procs.text(agent)).items():
            if job_id == job.pk:
                logs[round_, position] = turn
    rounds = list(Round.objects.filter(job=job).order_by("index"))
    turns = list(Turn.objects.filter(job=job).order_by("round__index", "position"))
    if any(t.status != Turn.Status.COMPLETED for t in turns) or len(turns) != n * len(rounds):
        raise RuntimeError(f"job {job.pk}: turns {[(t.pk, t.status) for t in turns]}")
    ends = {r.index: r.finished_at for r in rounds}
    phases: list[dict[str, float]] = []
    for i, turn in enumerate(turns):
        index = turn.round.index
        log_of = logs[index, turn.position]
        following = turns[i + 1].started_at if i + 1 < len(turns) else ends[index]
        gaps = [b - a for a, b in zip(log_of["stamps"], log_of["stamps"][1:], strict=False)]
        step = statistics.median(gaps)
        steps = step * len(log_of["stamps"])
        agent_part = (turn.finished_at - log_of["my_turn"]).total_seconds()
        phases.append(
            {
                "period_s": (following - turn.started_at).total_seconds(),
                "pickup_s": (log_of["my_turn"] - turn.started_at).total_seconds(),
                "steps_s": steps,
                "step_median_s": step,
                "handshake_end_s": agent_part - steps,
                "scheduling_s": (following - turn.finished_at).total_seconds(),
                "sealing_s": (log_of["sealed"] - log_of["done"]).total_seconds(),
                "recipients": log_of["recipients"],
            }
        )
    walls = [(r.finished_at - r.started_at).total_seconds() for r in rounds]
    handovers = handover_phases(turns, [logs[t.round.index, t.position] for t in turns])
    first = logs[turns[0].round.index, turns[0].position]
    first_step = _answered(first, 0)
    return {
        "hospitals": n,
        "job": job.pk,
        "steps_per_turn": steps,
        "local_epochs": data["local_epochs"],
        "round_wall_s": walls,
        "round_wall_median_s": statistics.median(walls),
        "per_turn_s": statistics.median(walls) / n,
        "phases": {
            key: statistics.fmean(p[key] for p in phases)
            for key in phases[0]
            if key != "recipients"
        },
        "turns_measured": len(phases),
        "step_median_s": statistics.median(p["step_median_s"] for p in phases),
        "handovers": handovers,
        "handover": {key: statistics.median(h[key] for h in handovers) for key in handovers[0]}
        if handovers
        else {},
        "create_to_first_step_s": (first_step - created).total_seconds()
        if first_step is not None
        else None,
    }


def _answered(log_of: dict[str, Any], index: int) -> datetime | None:
    """When the agent had training step ``index`` (0 the first, -1 the last) answered: the
    progress bar's stamp after its start, ``start state ready`` (``None`` without it)."""
    if log_of["ready"] is None or not log_of["stamps"]:
        return None
    return log_of["ready"] + timedelta(seconds=log_of["stamps"][index])


#: The hand-over's phases, in order, as (key, title); they add up to the hand-over.
HANDOVER_PHASES = [
    ("turn_end_s", "turn's end at the worker"),
    ("scheduling_s", "state change + follow-up task"),
    ("long_poll_s", "next agent's long-poll answer"),
    ("open_s", "hand-off fetched and opened"),
    ("setup_s", "data and segments set up"),
    ("handshake_s", "handshake and first step"),
]


def handover_phases(turns: list, logs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per pair of consecutive turns of a job (across rounds too), the hand-over from the
    first's last training step answered to the second's first step answered, in phases:
    to the first's ``finished_at`` (the worker's end of the turn: final snapshot, turn
    completed); to the second's ``started_at`` (the worker's follow-up task advancing the
    job, the coordinator's state change); to the second agent's ``turn assigned`` (its
    long-poll answered); to its ``start state ready`` (waiting for the sealed hand-off,
    fetching and opening it); to its ``my turn`` (data, split model, parties, client); to
    its first step answered (the server's handshake, then one training step)."""
    found = []
    for (a, la), (b, lb) in zip(
        zip(turns, logs, strict=True), list(zip(turns, logs, strict=True))[1:], strict=False
    ):
        last, first = _answered(la, -1), _answered(lb, 0)
        if last is None or first is None or lb["assigned"] is None:
            continue
        phases = {
            "turn_end_s": (a.finished_at - last).total_seconds(),
            "scheduling_s": (b.started_at - a.finished_at).total_seconds(),
            "long_poll_s": (lb["assigned"] - b.started_at).total_seconds(),
            "open_s": (lb["ready"] - lb["assigned"]).total_seconds(),
            "setup_s": (lb["my_turn"] - lb["ready"]).total_seconds(),
            "handshake_s": (first - lb["my_turn"]).total_seconds(),
        }
        phases["total_s"] = (first - last).total_seconds()
        found.append(phases)
    return found


# -- the run --------------------------------------------------------------------------------


def bench(args: argparse.Namespace, procs: Processes, tag: str, slugs: list[str]) -> dict:
    import numpy as np
    import torch
    from django.conf import settings

    admin = make_admin(f"bench-scaling-{tag}")
    log(f"jobs are numbered from {unique_job_ids(tag)}")
    url = start_platform(procs, threads=args.threads, name=f"bench-scaling-{tag}")
    log(f"coordinator at {url}")
    count = max(args.hospitals)
    paths, source = write_parts(procs.folder, count)
    samples = [len(np.load(p)["train_labels"]) for p in paths]
    pids = {}
    for i, path in enumerate(paths):
        slug = f"bench-scaling-{tag}-{i}"
        slugs.append(slug)
        data = {"kind": "medmnist", "path": str(path), "split": "train", "val_fraction": "0"}
        code = register_hospital(admin, slug)
        pids[f"agent-{i}"] = start_agent(procs, f"agent-{i}", url=url, code=code, data=data)
        time.sleep(1.0)  # a little apart: each imports torch and MONAI on a shared machine
    wait_enrolled(procs, slugs, timeout=600)
    log(f"{count} agents enrolled and reported their data")
    wait_until("the worker to be ready", lambda: WORKER_READY in procs.text("worker"), 180, procs)
    log("warm-up job: one 2-step turn per agent")
    run_job(args, procs, admin, slugs, tag, min(samples), steps=2, rounds=1)
    load = [os.getloadavg()[0]]
    configs = []
    for n in args.hospitals:
        config = run_job(
            args, procs, admin, slugs[:n], tag, min(samples), steps=args.steps, rounds=args.rounds
        )
        load.append(os.getloadavg()[0])
        log(
            f"{n} hospital(s): round {config['round_wall_median_s']:.2f} s (median), "
            f"{config['per_turn_s']:.2f} s per turn"
        )
        configs.append(config)
    base = next((c for c in configs if c["hospitals"] == 1), configs[0])
    for c in configs:
        c["ratio_to_base"] = c["round_wall_median_s"] / base["round_wall_median_s"]
        c["ratio_per_hospital"] = c["ratio_to_base"] / (c["hospitals"] / base["hospitals"])
    memory = {name: proc_status(pid) for name, pid in pids.items()}
    rss = [m.get("VmRSS", 0) for m in memory.values()]
    hwm = [m.get("VmHWM", 0) for m in memory.values()]
    return {
        "command": shlex.join(sys.orig_argv),
        "date": today(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "model": args.model,
        "batch_size": args.batch_size,
        "steps_per_turn": args.steps,
        "rounds": args.rounds,
        "data": source,
        "samples_per_agent": samples,
        "agents": count,
        "agent_rss_bytes": {"max": max(rss), "total": sum(rss)},
        "agent_hwm_bytes": {"max": max(hwm), "total": sum(hwm)},
        "load_average": load,
        "configurations": configs,
    }


# -- output ---------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    r = result
    rounds = table(
        [
            "date",
            "hospitals",
            "round wall (median of rounds)",
            "per turn",
            "ratio to 1 hospital",
            "ratio / hospitals (1 = linear)",
        ],
        [
            [
                today(),
                c["hospitals"],
                f"{c['round_wall_median_s']:.2f} s ("
                + ", ".join(f"{w:.2f}" for w in c["round_wall_s"])
                + ")",
                f"{c['per_turn_s']:.2f} s",
                f"**{c['ratio_to_base']:.2f}**",
                f"{c['ratio_per_hospital']:.2f}",
            ]
            for c in r["configurations"]
        ],
    )
    turns = table(
        [
            "hospitals",
            "turn period",
            f"steps ({r['steps_per_turn']} × median step)",
            "pick-up",
            "handshake and end",
            "scheduling",
            "overhead (period − steps)",
            "sealing for n − 1 (overlaps pick-up)",
        ],
        [
            [
                c["hospitals"],
                f"{p['period_s']:.2f} s",
                f"{p['steps_s']:.2f} s ({p['step_median_s'] * 1e3:.1f} ms)",
                f"{p['pickup_s']:.2f} s",
                f"{p['handshake_end_s']:.2f} s",
                f"{p['scheduling_s']:.2f} s",
                f"**{p['period_s'] - p['steps_s']:.2f} s**",
                f"{p['sealing_s']:.3f} s",
            ]
            for c in r["configurations"]
            for p in [c["phases"]]
        ],
    )
    handover = table(
        [
            "hospitals",
            "hand-overs",
            *(title for _, title in HANDOVER_PHASES),
            "hand-over (median)",
            "median step",
            "hand-over / step (goal ≤ 5)",
            "job created → first step",
        ],
        [
            [
                c["hospitals"],
                len(c["handovers"]),
                *(f"{h[key] * 1e3:.0f} ms" for key, _ in HANDOVER_PHASES),
                f"**{h['total_s'] * 1e3:.0f} ms** ("
                + "–".join(
                    f"{v * 1e3:.0f}"
                    for v in (
                        min(x["total_s"] for x in c["handovers"]),
                        max(x["total_s"] for x in c["handovers"]),
                    )
                )
                + ")",
                f"{c['step_median_s'] * 1e3:.1f} ms",
                f"**{h['total_s'] / c['step_median_s']:.1f}**",
                f"{c['create_to_first_step_s']:.2f} s"
                if c["create_to_first_step_s"] is not None
                else "—",
            ]
            for c in r["configurations"]
            if c["handovers"]
            for h in [c["handover"]]
        ],
    )
    load = ", ".join(f"{v:.1f}" for v in r["load_average"])
    notes = [
        f"`{r['command']}`: {r['model']} 1x28x28, batch {r['batch_size']}, "
        f"{r['steps_per_turn']} steps per turn, {r['rounds']} measured round(s) per "
        f"configuration after a warm-up job (one 2-step turn per agent); {r['agents']} agent "
        f"processes, each with {min(r['samples_per_agent'])}–{max(r['samples_per_agent'])} "
        f"images of {r['data']}; {r['threads']} torch threads per process, {r['cpus']} CPUs, "
        f"torch {r['torch']}.",
        f"Agents' resident memory at the end: at most "
        f"{r['agent_rss_bytes']['max'] / MiB:,.0f} MiB each (peak "
        f"{r['agent_hwm_bytes']['max'] / MiB:,.0f} MiB), "
        f"{r['agent_rss_bytes']['total'] / MiB:,.0f} MiB together; 1-minute load average "
        f"before and after each configuration: {load}.",
        "Turn phases are means over the measured turns; hand-over phases are medians "
        "over the job's hand-overs (each phase's own median: they need not add up to the "
        "median hand-over), with the hand-overs' range in brackets.",
    ]
    return rounds + "\n\n" + turns + "\n\n" + handover + "\n\n" + "\n".join(f"- {n}" for n in notes)


def show(result: dict[str, Any]) -> None:
    print(markdown(result))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tag, folder = new_run("scaling")
    queue = f"medsplit-bench-scaling-{tag}"
    # As a deployment runs it (docker-compose.yml): a job is sent to the worker when it
    # is scheduled, not at the next sweep, and every process shares one cache (the
    # long-polls' wake-up counter, training/api/long_poll.py).
    # And with room for every agent's long-poll: `runserver` runs a thread per request,
    # and a deployment holds `processes x MEDSPLIT_LONG_POLLS_PER_PROCESS` polls at once
    # (docs/deploy.md); with the default 4, six of ten agents were answered at once and
    # polled again 2 s later, which was most of every hand-over to them (2026-12-04).
    extra = {
        "MEDSPLIT_JOB_DISPATCHER": "workers.dispatch.CeleryDispatcher",
        "MEDSPLIT_CACHE_URL": args.redis_url,
        "MEDSPLIT_LONG_POLLS_PER_PROCESS": str(max(args.hospitals) + 2),
    }
    env = configure_platform(folder, args.redis_url, queue, args.threads, extra)
    procs = Processes(folder, env, slug="")
    slugs: list[str] = []
    log(f"setting up in {folder} (queue {queue})")
    with platform_run(
        folder,
        keep=args.keep,
        tails=lambda: procs.tails(1500),
        stop=lambda: stop_platform(procs),
        clean_redis=lambda: clean_hospitals(args.redis_url, queue, slugs),
    ):
        result = bench(args, procs, tag, slugs)
    print_result(result, args.json, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
