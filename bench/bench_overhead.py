"""Benchmark the platform's overhead: time per training step of a job through the whole
path (a real hospital agent process, Redis, a real Celery worker process and back)
against unsplit training of the same model on the same batches in one process.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``; the real per-hospital ACL users are made on it)::

    .venv/bin/python bench/bench_overhead.py                   # a table
    .venv/bin/python bench/bench_overhead.py --steps 5 --warmup 2 --json

Models (``--models``, each ``name:C,H,W``; default DenseNet121 at 1x28x28 and at
1x64x64, and ResNet-18 at 1x28x28), each at its registry default cut, vanilla mode,
batch 32, codec ``none``, SGD with momentum on both sides, 2 classes. A model that does
not run at its input shape (DenseNet121 at 1x28x28: its pooling layers shrink the image
to nothing, whatever the cut) is not measured: its row says why, in the library's words.
ResNet-18 runs at 1x28x28, the size DenseNet121 cannot take (MONAI's ResNet keeps full
resolution in its stem, so at 1x64x64 a step costs several times DenseNet121's).

The platform runs as real processes, as ``bench_agent.py`` sets it up (and with its
helpers and those of ``platform_setup.py``): the coordinator (``manage.py runserver``)
on a temporary SQLite database (or ``DATABASE_URL``), a Celery worker (``--pool=solo``)
and Celery beat on a unique queue, and one hospital agent, ``python -m hospital_agent
run``, per input shape: synthetic images (``(warmup + steps) x batch`` of them, no
validation split), enrolled with a one-time code (its own Redis ACL user). For each
model the script makes a one-hospital, one-round job with ``max_steps_per_turn = warmup
+ steps``, schedules it and waits until it completed.

Per step, platform side: the agent's own progress bar (tqdm, updated from
``TurnClient``'s ``on_step`` when a step's gradient has come back and the front's
optimizer has stepped) is set by tqdm's ``TQDM_*`` environment defaults to print, at
every step, the step count and the seconds since the turn began; nothing in the agent is
changed. A step's time is the gap between two consecutive stamps; the first ``warmup``
steps are left out, and so are everything before them (process start, enrolment, model
builds and tracing on both sides, the turn's handshake) and after the last step (the
final snapshot, the hand-off).

Per step, unsplit side: ``medsplit.training.reference.train_unsplit`` (the yardstick of
the exactness tests: the whole model, the job's batch sequence, the same per-parameter
optimizers) in this process, on the job's model built from its seed and on the agent's
data, rebuilt here from the same source and seed with the agent's own loader
(``hospital_agent.data``). Its loss function stamps the time; a step's time is the gap
between two consecutive stamps (the backward pass and optimizer step of one step and the
forward pass of the next), the first ``warmup`` steps left out, the model build and copy
before them. It runs once before and once after the platform's turn, and the two are
pooled, so slow drift of a shared machine hits both sides alike. The agent's final
weights are compared with the unsplit ones (``torch.equal``) to show the batches were
the same.

Every process runs ``--threads`` torch threads (2): ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` in each child, ``torch.set_num_threads`` in the worker and here. The
two sides of a split step alternate, so both paths have the same compute parallelism at
any time. Deterministic algorithms are off in every process (``MEDSPLIT_DETERMINISTIC=0``
for the worker): the agent never turns them on, while the worker does by default, and on
CPU they made a step several times slower here (ResNet-18 1x64x64), so leaving them on
in the worker and in the unsplit baseline would compare different kernels;
``--deterministic`` turns them on in the worker and here (not in the agent, which has no
such switch). The goal (platform / unsplit time per step at most 1.15) is judged on
medians: a burst of other work on a shared machine throws single steps far out. Means
and minimums are shown too; the minimum is each side's least disturbed step (other work
only ever adds time). Jobs are numbered from a large number drawn for the run (the
relay's keys carry the job id, and the test suite deletes the keys of the small job ids
its own databases use). At the end every process is stopped, the Redis keys made here
(queue, streams, hand-offs) and the hospitals' ACL users are deleted, and the temporary
folder is removed (``--keep`` keeps it with the processes' logs).

Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shlex
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_agent import _DONE, Processes, parse_agent_log, wait_until
from platform_setup import (
    WORKER_READY,
    add_run_args,
    clean_hospitals,
    configure_platform,
    default_cut,
    job_data,
    log,
    make_admin,
    new_run,
    platform_run,
    print_result,
    register_hospital,
    shape_of,
    start_agent,
    start_platform,
    step_stamps,
    stop_platform,
    unique_job_ids,
    wait_enrolled,
    wait_job,
)
from report import table, today

GOAL_RATIO = 1.15
DEFAULT_MODELS = ["densenet121:1,28,28", "densenet121:1,64,64", "resnet18:1,28,28"]
DATA_SEED = 7


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps per run")
    parser.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_MODELS,
        metavar="NAME:C,H,W",
        help=f"models and input shapes (default: {' '.join(DEFAULT_MODELS)})",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=50,
        help="server (and agent snapshot) checkpoint interval (the coordinator's default)",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic algorithms in the worker and the baseline (not in the agent)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument(
        "--without-hiredis",
        action="store_true",
        help="hide hiredis from the agent and the worker: redis-py's pure-Python RESP",
    )
    add_run_args(parser)
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    return args


def model_specs(args: argparse.Namespace) -> list[tuple[str, tuple[int, ...]]]:
    specs = []
    for text in args.models:
        name, _, shape = text.partition(":")
        specs.append((name, shape_of(shape or "1,64,64")))
    return specs


def not_runnable(name: str, shape: tuple[int, ...]) -> str | None:
    """Why ``name`` cannot be trained at ``shape`` cut at its default cut, or ``None``."""
    from medsplit.errors import MedSplitError
    from medsplit.training.setup import JobModel

    model = JobModel(name, len(shape) - 1, shape[0], 2, shape, seed=0)
    try:
        model.split_at((default_cut(name),))
    except MedSplitError as e:
        return str(e)
    return None


# -- the two sides ------------------------------------------------------------------------


def gaps(stamps: list[float], warmup: int) -> list[float]:
    """Step times: gaps between consecutive stamps, the first ``warmup`` steps left out."""
    return [b - a for a, b in itertools.pairwise(stamps[warmup - 1 :])]


def agent_train_split(shape: tuple[int, ...], samples: int, input_shape: tuple[int, ...]):
    """The agent's training data, as its own loader makes it from the same source."""
    from hospital_agent.data import DataSource, load_local, prepare

    source = DataSource(
        kind="synthetic", samples=samples, num_classes=2, shape=shape, seed=DATA_SEED
    )
    data, _ = load_local(
        source, input_shape=input_shape, num_classes=2, val_fraction=0.0, seed=DATA_SEED
    )
    return prepare(data, input_shape=input_shape, num_classes=2).train


def unsplit_run(job, train, warmup: int) -> tuple[list[float], Any]:
    """``train_unsplit`` over the job's batches; its step times and the trained model."""
    import torch

    from medsplit.training.reference import train_unsplit
    from medsplit.training.setup import cached_split
    from workers.turn_runner import job_model

    config = job.training_config()
    model = job_model(job)
    split = cached_split(model, config.cuts)
    whole = model.build()
    stamps: list[float] = []
    cross_entropy = torch.nn.CrossEntropyLoss()

    def loss_fn(logits, labels):
        stamps.append(time.perf_counter())
        return cross_entropy(logits, labels)

    trained = train_unsplit(whole, [train], config, split, loss_fn=loss_fn)
    return gaps(stamps, warmup), trained


def same_weights(job, final: Path, trained) -> bool | None:
    """Whether the agent's final front equals the unsplit model's (``None``: no file)."""
    import torch

    from medsplit.protocol.handoff import import_parties
    from medsplit.training.setup import cached_split, client_parties
    from workers.turn_runner import job_model

    if not final.exists():
        return None
    config = job.training_config()
    parties = client_parties(cached_split(job_model(job), config.cuts), config)
    import_parties(final.read_bytes(), parties)
    want = trained.state_dict()
    got = parties["front"].module.state_dict()
    return all(torch.equal(value, want[name]) for name, value in got.items())


def summary(step_times: list[float]) -> dict[str, float]:
    return {
        "steps": len(step_times),
        "median_s": statistics.median(step_times),
        "mean_s": statistics.fmean(step_times),
        "min_s": min(step_times),
        "max_s": max(step_times),
    }


# -- one model ----------------------------------------------------------------------------


def measure(
    args: argparse.Namespace,
    procs: Processes,
    admin,
    name: str,
    shape: tuple[int, ...],
    agent: str,
    slug: str,
    tag: str,
) -> dict[str, Any]:
    from training import services
    from training.models import Turn
    from training.states import JobState

    total = args.warmup + args.steps
    data = job_data(
        name=f"bench-overhead {tag} {name} {shape}",
        model=name,
        batch_size=args.batch_size,
        steps=total,
        slug=slug,
    )
    job = services.job_create(actor=admin, data=data)
    train = agent_train_split(shape, total * args.batch_size, job.job_description().input_shape)
    baseline: list[list[float]] = []

    def unsplit(n: int):
        log(f"{name} {shape}: unsplit training in this process, {total} steps (run {n})")
        step_times, trained = unsplit_run(job, train, args.warmup)
        baseline.append(step_times)
        return trained

    unsplit(1)
    offset = len(procs.text(agent))
    scheduled_at = datetime.now()
    load_before = os.getloadavg()[0]
    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin)
    log(f"{name} {shape}: job {job.pk} scheduled ({total} steps); waiting for it to complete")
    wait_job(procs, job.pk, args.timeout)
    wait_until(
        "the agent's 'turn done' line", lambda: _DONE.search(procs.text(agent)[offset:]), 60, procs
    )
    load_after = os.getloadavg()[0]
    text = procs.text(agent)[offset:]
    bars = step_stamps(text)
    if not bars or len(bars[-1]) != total:
        raise RuntimeError(f"expected {total} step stamps in the agent's log, got {bars}")
    platform_times = gaps(bars[-1], args.warmup)
    agent_log = parse_agent_log(text)
    trained = unsplit(2)
    final = procs.folder / agent / "jobs" / f"job-{job.pk}" / "final.safetensors"
    deadline = time.monotonic() + 15
    while not final.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    turn = Turn.objects.get(job=job)
    pooled = summary([t for run in baseline for t in run])
    path = summary(platform_times)
    return {
        "model": name,
        "input_shape": list(shape),
        "cut": default_cut(name),
        "runnable": True,
        "job": job.pk,
        "unsplit": pooled,
        "unsplit_runs_median_s": [statistics.median(run) for run in baseline],
        "platform": path,
        "ratio_median": path["median_s"] / pooled["median_s"],
        "ratio_mean": path["mean_s"] / pooled["mean_s"],
        "goal_met": path["median_s"] / pooled["median_s"] <= GOAL_RATIO,
        "same_weights_as_unsplit": same_weights(job, final, trained),
        "bytes_per_step": (turn.bytes_up + turn.bytes_down) / max(turn.steps, 1),
        "agent_turn_done": agent_log["line"],
        "agent_turn_wall_s": agent_log["turn_wall_s"],
        "scheduled_to_agent_turn_s": (agent_log["turn_began"] - scheduled_at).total_seconds(),
        "load_average": [load_before, load_after],
    }


# -- the run ------------------------------------------------------------------------------


def bench(args: argparse.Namespace, procs: Processes, tag: str, slugs: list[str]) -> dict[str, Any]:
    import torch
    from django.conf import settings

    from medsplit.runtime import keep_freed_memory

    # The unsplit baseline runs here: on the allocator the agent and the worker run on.
    allocator = keep_freed_memory()
    torch.set_num_threads(args.threads)
    deterministic = settings.MEDSPLIT["DETERMINISTIC"]
    if deterministic:  # as the worker then does (workers/celery_app.py)
        torch.use_deterministic_algorithms(True)
    admin = make_admin(f"bench-overhead-{tag}")
    log(f"jobs are numbered from {unique_job_ids(tag)}")
    url = start_platform(procs, threads=args.threads, name=f"bench-overhead-{tag}")
    log(f"coordinator at {url}")
    reasons = {spec: not_runnable(*spec) for spec in model_specs(args)}
    for (name, shape), reason in reasons.items():
        if reason:
            log(f"{name} at {shape} is not runnable: {reason}")
    shapes = sorted({spec[1] for spec, reason in reasons.items() if not reason})
    total = args.warmup + args.steps
    agents: dict[tuple[int, ...], tuple[str, str]] = {}
    for index, shape in enumerate(shapes):
        agent, slug = f"agent-{index}", f"bench-overhead-{tag}-{index}"
        slugs.append(slug)
        data = {
            "kind": "synthetic",
            "samples": str(total * args.batch_size),
            "shape": ",".join(map(str, shape)),
            "num_classes": "2",
            "seed": str(DATA_SEED),
            "val_fraction": "0",
        }
        start_agent(procs, agent, url=url, code=register_hospital(admin, slug), data=data)
        agents[shape] = (agent, slug)
    wait_enrolled(procs, [slug for _, slug in agents.values()])
    log(f"{len(agents)} agent(s) enrolled and reported their data")
    wait_until("the worker to be ready", lambda: WORKER_READY in procs.text("worker"), 180, procs)
    log("worker ready")
    rows = []
    for (name, shape), reason in reasons.items():
        if reason:
            rows.append(
                {
                    "model": name,
                    "input_shape": list(shape),
                    "cut": default_cut(name),
                    "runnable": False,
                    "reason": reason,
                }
            )
            continue
        agent, slug = agents[shape]
        row = measure(args, procs, admin, name, shape, agent, slug, tag)
        log(
            f"{name} {shape}: unsplit {row['unsplit']['median_s'] * 1e3:.1f} ms, platform "
            f"{row['platform']['median_s'] * 1e3:.1f} ms per step (medians): "
            f"ratio {row['ratio_median']:.3f}"
        )
        rows.append(row)
    return {
        "command": shlex.join(sys.orig_argv),
        "date": today(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "deterministic": deterministic,
        "allocator": "freed memory kept" if allocator.applied else allocator.reason,
        "resp": "pure Python (hiredis hidden)" if args.without_hiredis else resp_of_children(),
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "batch_size": args.batch_size,
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "goal": GOAL_RATIO,
        "models": rows,
    }


# -- output ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def _input(row: dict[str, Any]) -> str:
    return "x".join(map(str, row["input_shape"]))


def markdown(result: dict[str, Any]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    r = result
    rows = []
    for m in r["models"]:
        name = f"{m['model']} {_input(m)}"
        if not m["runnable"]:
            reason = f"not runnable: {m['reason']}"
            rows.append([today(), name, m["cut"], reason, "–", "–", "–", "–"])
            continue
        u, p = m["unsplit"], m["platform"]
        fastest = p["min_s"] / u["min_s"]
        same = {True: "yes", False: "no", None: "–"}[m["same_weights_as_unsplit"]]
        rows.append(
            [
                today(),
                name,
                m["cut"],
                f"{_ms(u['median_s'])} ({_ms(u['mean_s'])}; {_ms(u['min_s'])})",
                f"{_ms(p['median_s'])} ({_ms(p['mean_s'])}; {_ms(p['min_s'])})",
                f"**{m['ratio_median']:.3f}** ({m['ratio_mean']:.3f}; {fastest:.3f})",
                same,
                f"≤ {r['goal']}",
            ]
        )
    text = table(
        [
            "date",
            "model, input",
            "cut",
            "unsplit, ms per step: median (mean; min)",
            "platform, ms per step: median (mean; min)",
            "platform / unsplit: median (mean; min)",
            "same weights",
            "goal",
        ],
        rows,
    )
    measured = [m for m in r["models"] if m["runnable"]]
    notes = [
        f"`{r['command']}`: batch {r['batch_size']}, {r['warmup_steps']} warm-up then "
        f"{r['timed_steps']} timed steps per run (unsplit: 2 runs pooled, before and after "
        f"the platform's turn), {r['threads']} torch threads per process, "
        f"deterministic={r['deterministic']}, {r['cpus']} CPUs, torch {r['torch']}, "
        f"allocator: {r.get('allocator', 'glibc defaults')}, "
        f"RESP in agent and worker: {r.get('resp', 'not recorded')}.",
    ]
    for m in measured:
        lo, hi = m["load_average"]
        notes.append(
            f"{m['model']} {_input(m)}: {m['bytes_per_step']:,.0f} bytes on the relay per "
            f"step; scheduling to the agent's turn {m['scheduled_to_agent_turn_s']:.1f} s "
            f"(excluded); load average {lo:.1f} → {hi:.1f}."
        )
    return text + "\n\n" + "\n".join(f"- {n}" for n in notes)


def hide_hiredis(folder: Path) -> str:
    """The children's ``PYTHONPATH`` with a ``hiredis`` module first that fails to import,
    so that redis-py in the agent and the worker parses and packs RESP in pure Python (as
    it did before hiredis was a dependency) while running the same code."""
    shim = folder / "without-hiredis"
    shim.mkdir(exist_ok=True)
    (shim / "hiredis.py").write_text(
        'raise ImportError("hidden by bench_overhead.py --without-hiredis")\n'
    )
    repo = Path(__file__).resolve().parents[1]
    return os.pathsep.join([str(shim), str(repo), str(repo / "platform")])


def resp_of_children() -> str:
    """How redis-py speaks RESP in the children, which import what this interpreter has."""
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis' parser" if HIREDIS_AVAILABLE else "pure Python (no hiredis >= 3.2 installed)"


def show(result: dict[str, Any]) -> None:
    print(markdown(result))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tag, folder = new_run("overhead")
    queue = f"medsplit-bench-overhead-{tag}"
    extra = {
        "MEDSPLIT_CHECKPOINT_EVERY": str(args.checkpoint_every),
        "MEDSPLIT_DETERMINISTIC": "1" if args.deterministic else "0",
    }
    env = configure_platform(folder, args.redis_url, queue, args.threads, extra)
    if args.without_hiredis:  # the children's only: the unsplit baseline here uses no Redis
        env["PYTHONPATH"] = hide_hiredis(folder)
    procs = Processes(folder, env, slug="")
    slugs: list[str] = []
    log(f"setting up in {folder} (queue {queue})")
    with platform_run(
        folder,
        keep=args.keep,
        tails=procs.tails,
        stop=lambda: stop_platform(procs),
        clean_redis=lambda: clean_hospitals(args.redis_url, queue, slugs),
    ):
        result = bench(args, procs, tag, slugs)
    print_result(result, args.json, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
