"""Benchmark the runtime: split-training steps per second through Redis and a real Celery
worker, against the same turn in memory; and Redis memory during a 1000-step turn.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``)::

    .venv/bin/python bench/bench_runtime.py                 # both parts, a table
    .venv/bin/python bench/bench_runtime.py --steps 30 --memory-steps 1000 --json

The script sets itself up: a temporary SQLite database (or ``DATABASE_URL`` when set)
with migrations applied, a unique Celery queue, hospitals with unique slugs (the relay's
stream names carry them) and unique job seeds, a temporary checkpoint folder, and one
Celery worker subprocess (``--pool=solo``) that it stops (SIGTERM, then SIGKILL) at the
end; the Redis keys it made are deleted.

Part 1, steps per second. DenseNet121 (registry default cut ``features.transition1``),
input 1x64x64, batch 32, codec ``none``, SGD with momentum on both sides. One turn of
``warmup + steps`` steps runs through the real runtime: the job is scheduled, the
Celery dispatcher sends ``advance_job`` to the worker, which runs the turn's server
segment with :mod:`workers.turn_runner` (database leases, directives, progress,
checkpoints on disk); this process plays the hospital with ``TurnClient`` over a
``RedisChannel``. The baseline is ``SplitJob.run_turn`` on the same job, data and
batches: the same frames (encoded, through an ``InMemoryChannel``, decoded and checked),
the same compute, client and server alternating in one thread of one process, run once
before and once after the Redis turn and pooled. It is the stricter of the two in-memory
candidates: ``TurnServer`` and ``TurnClient`` over an ``InMemoryChannel`` in two threads
(no-op hooks, checkpoints in memory) run the same protocol code as the Redis path, but
two Python threads calling torch in one process get two OpenMP thread teams competing
for the cores, which made that baseline about 1.5x slower than ``SplitJob`` here and
would flatter the Redis path; it is timed once, for reference. So the ratio is what the
turn protocol, the relay, the process boundary and the coordinator's bookkeeping
(directive per step, progress, checkpoints) cost together. Times are taken from the
client's ``on_step`` callback: the first ``warmup`` steps (and model builds, process
start, handshake) are excluded; a step's time is the gap between two consecutive
callbacks. Every process uses ``--threads`` torch threads (the worker via
``torch.set_num_threads`` before Celery starts); both sides of a turn alternate, so each
path has the same compute parallelism at any time.

Part 2, Redis memory. A 1000-step turn of ``small_cnn`` (1x28x28, batch 32, cut
``pool1``) through Redis and the worker, while a thread samples ``INFO memory``
``used_memory`` (and ``MEMORY USAGE`` of this turn's own keys) every ~20 ms. Reported:
the baseline before the turn (median of ~1 s of samples), the peak during it, and the
difference, checked against ``4 x largest frame + 1 MiB`` (at most one frame is in
flight each way and consumed entries are deleted, so a few frames is all a turn should
hold). ``used_memory`` is the whole server's: other users of a shared Redis show in it;
the turn's own keys are measured apart.

Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platform_setup import (
    WORKER_READY,
    add_model_args,
    add_run_args,
    cleanup_redis,
    configure,
    default_cut,
    job_data,
    log,
    make_admin,
    new_run,
    print_result,
    read_log,
    remove_folder,
    setup_django,
    shape_of,
    spawn,
    stop_processes,
    worker_command,
)
from report import table, today

GOAL_RATIO = 1.15
MiB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (part 1)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps per run")
    add_model_args(parser)
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=50,
        help="server checkpoint interval, both paths (the coordinator's default)",
    )
    parser.add_argument("--memory-steps", type=int, default=1000, help="steps of part 2")
    parser.add_argument("--memory-model", default="small_cnn")
    parser.add_argument("--memory-input-shape", default="1,28,28")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="Redis memory sampling")
    parser.add_argument("--skip-steps", action="store_true", help="skip part 1")
    parser.add_argument("--skip-memory", action="store_true", help="skip part 2")
    add_run_args(parser)
    return parser.parse_args(argv)


# -- the worker ----------------------------------------------------------------------------


def configure_runtime(args: argparse.Namespace, folder: Path, tag: str) -> dict[str, str]:
    """Set this process's environment (read by the settings) and return the worker's."""
    return configure(
        folder,
        args.redis_url,
        f"medsplit-bench-{tag}",
        {"MEDSPLIT_CHECKPOINT_EVERY": str(args.checkpoint_every)},
    )


@dataclass
class Worker:
    """One Celery worker subprocess on the bench's own queue, logging to a file."""

    env: dict[str, str]
    log_path: Path
    threads: int
    tag: str
    process: subprocess.Popen | None = None

    def start(self) -> None:
        queue = self.env["MEDSPLIT_CELERY_QUEUE"]
        args = worker_command(self.threads, queue, f"bench-{self.tag}")
        self.process = spawn(args, self.env, self.log_path)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.process.returncode})\n{self.tail()}")
            if WORKER_READY.encode() in self.log_path.read_bytes():
                return
            time.sleep(0.2)
        raise RuntimeError(f"the worker was not ready within {timeout:g} s\n{self.tail()}")

    def stop(self, wait: float = 15.0) -> None:
        if self.process is not None:
            stop_processes({"worker": self.process}, wait)

    def tail(self, chars: int = 4000) -> str:
        return read_log(self.log_path)[-chars:]


# -- jobs ----------------------------------------------------------------------------------


@dataclass
class Bench:
    """What the runs share: the admin who creates jobs, the tag that names everything."""

    tag: str
    admin: Any
    redis_url: str
    checkpoint_every: int
    slugs: list[str] = field(default_factory=list)

    def job(self, *, model: str, shape: tuple[int, ...], batch: int, steps: int, label: str):
        """A one-hospital, one-round job (draft) on a fresh hospital with a unique slug."""
        from hospitals.models import Hospital
        from training import services

        slug = f"bench-{self.tag}-{label}"
        self.slugs.append(slug)
        Hospital.objects.create(
            slug=slug,
            name=f"Bench {label}",
            status=Hospital.Status.ENROLLED,
            dataset_summary={
                "image_shape": list(shape),
                "label_counts": {"0": steps * batch // 2, "1": steps * batch // 2},
                "split_sizes": {"train": steps * batch, "val": 0},
            },
        )
        data = job_data(
            name=f"bench-runtime {label}", model=model, batch_size=batch, steps=steps, slug=slug
        )
        return services.job_create(actor=self.admin, data=data)


# -- timing ----------------------------------------------------------------------------


@dataclass
class StepTimes:
    """Per-step times of one run, from the client's ``on_step`` timestamps."""

    label: str
    stamps: list[float] = field(default_factory=list)
    warmup: int = 3

    def callback(self, total: int, every: int) -> Callable[[object], None]:
        def on_step(_: object) -> None:
            self.stamps.append(time.perf_counter())
            done = len(self.stamps)
            if done % every == 0 or done == total:
                log(f"  {self.label}: step {done}/{total}")

        return on_step

    @property
    def gaps(self) -> list[float]:
        timed = self.stamps[self.warmup - 1 :]
        return [b - a for a, b in itertools.pairwise(timed)]

    @property
    def seconds(self) -> float:
        return self.stamps[-1] - self.stamps[self.warmup - 1]


def pooled(runs: list[StepTimes]) -> dict[str, float]:
    gaps = [g for r in runs for g in r.gaps]
    total = sum(r.seconds for r in runs)
    return {
        "steps": len(gaps),
        "seconds": total,
        "mean_s": total / len(gaps),
        "median_s": statistics.median(gaps),
        "steps_per_s": len(gaps) / total,
    }


# -- the turns ---------------------------------------------------------------------------


class NoHooks:
    """The in-memory baseline's coordinator: always run, record nothing."""

    def directive(self):
        from medsplit.turns import Directive

        return Directive.RUN

    def progress(self, progress: object) -> None:
        pass

    def finish(self, metrics: object, progress: object) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


def measured_redis_channel(url: str):
    """A ``RedisChannel`` that remembers the largest payload it sent or received."""
    from medsplit.channel.redis import RedisChannel

    class Measured(RedisChannel):
        largest = 0

        def send(self, stream: str, payload: bytes) -> None:
            self.largest = max(self.largest, len(payload))
            super().send(stream, payload)

        def receive(self, stream: str, *, timeout: float) -> bytes:
            payload = super().receive(stream, timeout=timeout)
            self.largest = max(self.largest, len(payload))
            return payload

    return Measured(url)


def synthetic_train(job, samples: int):
    from medsplit.data import synthetic_split

    return synthetic_split(
        samples,
        shape=job.job_description().input_shape,
        num_classes=job.job_description().num_classes,
        seed=101,
    )


def client_for(job, channel, train, on_step):
    """The hospital's side of the job's only turn."""
    from medsplit.channel import RelayKeys
    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import client_parties
    from medsplit.turns import MemorySnapshots, TurnClient, TurnIds
    from workers.turn_runner import job_model

    config = job.training_config()
    split = job_model(job).split(config)
    slug = job.participants.get().hospital.slug
    client = TurnClient(
        ids=TurnIds(config.job, 0, 0, config.mode, config.codec),
        channel=channel,
        streams=RelayKeys().streams(config.job, slug),
        split=split,
        parties=lambda: client_parties(split, config),
        start=export_parties(client_parties(split, config)),
        config=config,
        train=train,
        val=None,
        snapshots=MemorySnapshots(),
        reply_timeout=180.0,
        on_step=on_step,
    )
    return client, split, config, slug


def run_memory_turn(bench: Bench, job, train, times: StepTimes, total: int) -> None:
    """Baseline: TurnServer and TurnClient over an InMemoryChannel, two threads."""
    from medsplit.channel import InMemoryChannel, RelayKeys
    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import server_party
    from medsplit.turns import ClientOutcome, MemoryCheckpointStore, TurnIds, TurnServer
    from medsplit.turns.server import SERVER_PARTY

    channel = InMemoryChannel()
    client, split, config, slug = client_for(
        job, channel, train, times.callback(total, max(1, total // 3))
    )
    server = TurnServer(
        ids=TurnIds(config.job, 0, 0, config.mode, config.codec),
        channel=channel,
        streams=RelayKeys().streams(config.job, slug),
        split=split,
        party=server_party(split, config),
        store=MemoryCheckpointStore(export_parties({SERVER_PARTY: server_party(split, config)})),
        hooks=NoHooks(),
        batch_size=config.batch_size,
        checkpoint_every=bench.checkpoint_every,
        silence_timeout=120.0,
    )
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(server.run()), daemon=True)
    thread.start()
    report = client.run()
    thread.join(60)
    if report.outcome != ClientOutcome.COMPLETED or not outcome:
        raise RuntimeError(f"in-memory turn ended {report.outcome}, server {outcome}")


def run_splitjob_turn(job, train, times: StepTimes, total: int) -> None:
    """Reference: SplitJob.run_turn (client and server in one thread, LocalLink)."""
    import torch

    from medsplit.training.split_job import Hospital as SplitHospital
    from medsplit.training.split_job import SplitJob
    from workers.turn_runner import job_model

    config = job.training_config()
    model = job_model(job).build()
    split_job = SplitJob(model, torch.zeros(2, *job.job_description().input_shape), config)
    split_job.run_turn(
        SplitHospital("h", train),
        index=0,
        round_=0,
        on_step=times.callback(total, max(1, total // 3)),
    )


def run_redis_turn(bench: Bench, job, train, times: StepTimes, total: int, every: int):
    """The real runtime: schedule the job (the worker serves it), play the hospital."""
    from medsplit.turns import ClientOutcome
    from training import services
    from training.models import Job
    from training.states import JobState

    channel = measured_redis_channel(bench.redis_url)
    client, *_ = client_for(job, channel, train, times.callback(total, every))
    try:
        started = time.monotonic()
        services.job_transition(job=job, to=JobState.SCHEDULED, actor=bench.admin)
        report = client.run()
        if report.outcome != ClientOutcome.COMPLETED:
            raise RuntimeError(f"the Redis turn ended {report.outcome}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            if state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.1)
        if state != JobState.COMPLETED:
            raise RuntimeError(f"job {job.pk} is {state} after its turn")
        return {
            "largest_frame": channel.largest,
            "bytes_up": report.bytes_up,
            "bytes_down": report.bytes_down,
            "turn_wall_s": time.monotonic() - started,
        }
    finally:
        channel.close()


# -- Redis memory ------------------------------------------------------------------------


class MemorySampler(threading.Thread):
    """Samples ``used_memory`` and the ``MEMORY USAGE`` of some keys every ``interval``."""

    def __init__(self, url: str, keys: list[str], interval: float) -> None:
        import redis

        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.keys = keys
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (time, used_memory, own keys)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                pipe = self.client.pipeline(transaction=False)
                pipe.info("memory")
                for key in self.keys:
                    pipe.memory_usage(key, samples=0)
                info, *usage = pipe.execute()
                own = sum(u or 0 for u in usage)
                self.samples.append((time.monotonic(), int(info["used_memory"]), own))
                self.halt.wait(self.interval)
        except BaseException as e:  # reported by the caller
            self.error = e

    def between(self, start: float, end: float) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.client.close()


def memory_part(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    from medsplit.channel import RelayKeys
    from medsplit.channel.redis import SEQ_SUFFIX

    steps = args.memory_steps
    job = bench.job(
        model=args.memory_model,
        shape=shape_of(args.memory_input_shape),
        batch=args.batch_size,
        steps=steps,
        label="memory",
    )
    train = synthetic_train(job, steps * args.batch_size)
    streams = RelayKeys().streams(job.training_config().job, bench.slugs[-1])
    keys = [streams.up, streams.down, streams.up + SEQ_SUFFIX, streams.down + SEQ_SUFFIX]
    sampler = MemorySampler(bench.redis_url, keys, args.sample_ms / 1000)
    sampler.start()
    times = StepTimes("redis memory turn", warmup=1)
    log(f"part 2: {steps}-step {args.memory_model} turn through Redis; baseline for 1 s")
    time.sleep(1.0)
    begin = time.monotonic()
    try:
        info = run_redis_turn(bench, job, train, times, steps, max(1, steps // 10))
    finally:
        end = time.monotonic()
        time.sleep(0.2)
        sampler.stop()
    if sampler.error is not None:
        raise sampler.error
    before = sampler.between(0, begin)
    during = sampler.between(begin, end)
    baseline = int(statistics.median(s[1] for s in before))
    peak = max(s[1] for s in during)
    largest = info["largest_frame"]
    bound = 4 * largest + MiB
    return {
        "model": args.memory_model,
        "input_shape": list(shape_of(args.memory_input_shape)),
        "batch_size": args.batch_size,
        "steps": steps,
        "turn_wall_s": info["turn_wall_s"],
        "steps_per_s": (len(times.stamps) - 1) / times.seconds,
        "samples": len(during),
        "sample_ms": args.sample_ms,
        "baseline_used_memory": baseline,
        "baseline_min_max": [min(s[1] for s in before), max(s[1] for s in before)],
        "peak_used_memory": peak,
        "peak_minus_baseline": peak - baseline,
        "own_keys_peak": max(s[2] for s in during),
        "after_used_memory": sampler.samples[-1][1],
        "largest_frame": largest,
        "bound_over_baseline": bound,
        "within_bound": peak - baseline <= bound,
    }


# -- part 1 ------------------------------------------------------------------------------


def steps_part(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    shape = shape_of(args.input_shape)
    total = args.warmup + args.steps
    spec = {"model": args.model, "shape": shape, "batch": args.batch_size, "steps": total}
    memory_job = bench.job(**spec, label="inmemory")
    redis_job = bench.job(**spec, label="redis")
    train = synthetic_train(memory_job, total * args.batch_size)
    runs: dict[str, list[StepTimes]] = {"splitjob": [], "redis": [], "threads": []}

    def splitjob_run(n: int) -> None:
        times = StepTimes(f"SplitJob turn {n}", warmup=args.warmup)
        log(f"part 1: SplitJob.run_turn in memory (baseline), {total} steps (run {n})")
        run_splitjob_turn(memory_job, train, times, total)
        runs["splitjob"].append(times)

    # The baseline runs before and after the Redis turn, so slow drift hits both alike.
    splitjob_run(1)
    times = StepTimes("redis+celery turn", warmup=args.warmup)
    log(f"part 1: Redis + Celery worker turn, {total} steps")
    info = run_redis_turn(bench, redis_job, train, times, total, max(1, total // 6))
    runs["redis"].append(times)
    splitjob_run(2)
    times = StepTimes("two-thread in-memory turn", warmup=args.warmup)
    log(f"part 1: TurnServer+TurnClient over InMemoryChannel, two threads, {total} steps")
    run_memory_turn(bench, memory_job, train, times, total)
    runs["threads"].append(times)

    figures = {name: pooled(r) for name, r in runs.items()}
    per_run = {
        name: [statistics.median(t.gaps) for t in r] for name, r in runs.items()
    }  # median step time of each run, seconds
    ratio_mean = figures["redis"]["mean_s"] / figures["splitjob"]["mean_s"]
    ratio_median = figures["redis"]["median_s"] / figures["splitjob"]["median_s"]
    return {
        "model": args.model,
        "cut": default_cut(args.model),
        "input_shape": list(shape),
        "batch_size": args.batch_size,
        "timed_steps": args.steps,
        "warmup_steps": args.warmup,
        "checkpoint_every": args.checkpoint_every,
        "paths": figures,
        "per_run_mean_s": per_run,
        "ratio_mean": ratio_mean,
        "ratio_median": ratio_median,
        "goal": GOAL_RATIO,
        # The median: a shared machine's bursts (another process taking the cores for a
        # few seconds) throw single steps far out and dominate a mean of 30.
        "goal_met": ratio_median <= GOAL_RATIO,
        "largest_frame": info["largest_frame"],
        "bytes_per_step": (info["bytes_up"] + info["bytes_down"]) / total,
    }


# -- output --------------------------------------------------------------------------------


def show(result: dict[str, Any]) -> None:
    print(f"command: {result['command']}")
    print(
        f"torch {result['torch']}, {result['threads']} torch threads in every process, "
        f"deterministic={result['deterministic']}, database {result['database']}"
    )
    steps = result.get("steps")
    if steps:
        print()
        print(
            f"Part 1: {steps['model']} cut after {steps['cut']}, input "
            f"{'x'.join(map(str, steps['input_shape']))}, batch {steps['batch_size']}, codec none; "
            f"{steps['timed_steps']} timed steps per run after {steps['warmup_steps']} warm-up"
        )
        names = {
            "splitjob": "in-memory SplitJob.run_turn (baseline, 2 runs)",
            "redis": "Redis + Celery worker",
            "threads": "TurnServer+TurnClient, InMemoryChannel, 2 threads",
        }
        print(f"  {'path':<52} {'steps/s':>8} {'mean ms':>9} {'median ms':>10}")
        for key, name in names.items():
            p = steps["paths"][key]
            print(
                f"  {name:<52} {p['steps_per_s']:>8.3f} {p['mean_s'] * 1e3:>9.1f} "
                f"{p['median_s'] * 1e3:>10.1f}"
            )
        runs = ", ".join(f"{s * 1e3:.1f}" for s in steps["per_run_mean_s"]["splitjob"])
        print(f"  baseline runs, median ms per step: {runs}")
        verdict = "met" if steps["goal_met"] else "NOT met"
        print(
            f"  Redis+Celery / in-memory time per step: median {steps['ratio_median']:.3f} "
            f"(goal <= {steps['goal']}: {verdict}); mean {steps['ratio_mean']:.3f}"
        )
        print(
            f"  largest frame {steps['largest_frame']:,} bytes; "
            f"{steps['bytes_per_step']:,.0f} bytes on the wire per step"
        )
    memory = result.get("memory")
    if memory:
        print()
        print(
            f"Part 2: Redis used_memory during a {memory['steps']}-step {memory['model']} turn "
            f"(input {'x'.join(map(str, memory['input_shape']))}, batch {memory['batch_size']}), "
            f"{memory['samples']} samples every ~{memory['sample_ms']:g} ms, "
            f"{memory['steps_per_s']:.1f} steps/s"
        )
        rows = [
            ("baseline (median before the turn)", memory["baseline_used_memory"]),
            ("peak during the turn", memory["peak_used_memory"]),
            ("peak - baseline", memory["peak_minus_baseline"]),
            ("bound: 4 x largest frame + 1 MiB", memory["bound_over_baseline"]),
            ("largest frame", memory["largest_frame"]),
            ("this turn's own keys, peak (MEMORY USAGE)", memory["own_keys_peak"]),
            ("after the turn", memory["after_used_memory"]),
        ]
        for name, value in rows:
            print(f"  {name:<44} {value:>14,} B  {value / MiB:>9.3f} MiB")
        lo, hi = memory["baseline_min_max"]
        print(f"  baseline samples ranged {lo:,} .. {hi:,} B (other users of Redis show here)")
        verdict = "within" if memory["within_bound"] else "OVER"
        print(f"  peak - baseline is {verdict} the bound")


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    parts = []
    steps = result.get("steps")
    if steps:
        p = steps["paths"]
        verdict = "met" if steps["goal_met"] else "**not met**"
        parts.append(
            table(
                [
                    f"run ({today()})",
                    "in-memory baseline, median ms (steps/s)",
                    "Redis + Celery, median ms (steps/s)",
                    "ratio, median (mean)",
                    "two threads in memory, median ms",
                    "goal",
                ],
                [
                    [
                        f"{steps['model']} {'x'.join(map(str, steps['input_shape']))} "
                        f"b{steps['batch_size']}",
                        f"{p['splitjob']['median_s'] * 1e3:.1f} "
                        f"({p['splitjob']['steps_per_s']:.3f})",
                        f"{p['redis']['median_s'] * 1e3:.1f} ({p['redis']['steps_per_s']:.3f})",
                        f"**{steps['ratio_median']:.3f}** ({steps['ratio_mean']:.3f})",
                        f"{p['threads']['median_s'] * 1e3:.1f}",
                        f"≤ {steps['goal']}: {verdict}",
                    ]
                ],
            )
            + f"\n\n{steps['bytes_per_step']:,.0f} bytes cross the relay per step; largest "
            f"frame {steps['largest_frame']:,} bytes."
        )
    memory = result.get("memory")
    if memory:
        parts.append(
            table(
                [
                    f"turn ({today()})",
                    "baseline",
                    "peak during turn",
                    "peak − baseline",
                    "bound over baseline",
                    "this turn's keys, peak",
                    "within",
                ],
                [
                    [
                        f"{memory['steps']} steps {memory['model']}",
                        f"{memory['baseline_used_memory']:,} B",
                        f"{memory['peak_used_memory']:,} B",
                        f"{memory['peak_minus_baseline']:,} B "
                        f"({memory['peak_minus_baseline'] / MiB:.2f} MiB)",
                        f"{memory['bound_over_baseline']:,} B "
                        f"({memory['bound_over_baseline'] / MiB:.2f} MiB)",
                        f"{memory['own_keys_peak']:,} B",
                        "yes" if memory["within_bound"] else "**no**",
                    ]
                ],
            )
            + f"\n\nLargest frame {memory['largest_frame']:,} bytes; `used_memory` after the "
            f"turn {memory['after_used_memory']:,} B."
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tag, folder = new_run("runtime")
    env = configure_runtime(args, folder, tag)
    log(f"setting up in {folder} (queue {env['MEDSPLIT_CELERY_QUEUE']})")
    worker = Worker(env, folder / "worker.log", args.threads, tag)
    worker.start()  # starts while this process migrates the database
    bench: Bench | None = None
    result: dict[str, Any] = {}
    try:
        import torch

        torch.set_num_threads(args.threads)
        setup_django()
        from django.conf import settings

        deterministic = settings.MEDSPLIT["DETERMINISTIC"]
        if deterministic:  # as the worker does (workers/celery_app.py)
            torch.use_deterministic_algorithms(True)
        bench = Bench(tag, make_admin(f"bench-{tag}"), args.redis_url, args.checkpoint_every)
        log("database migrated; waiting for the worker")
        worker.wait_ready()
        log("worker ready")
        result = {
            "command": shlex.join(sys.orig_argv),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": args.threads,
            "deterministic": deterministic,
            "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        }
        if not args.skip_steps:
            result["steps"] = steps_part(bench, args)
        if not args.skip_memory:
            result["memory"] = memory_part(bench, args)
    except BaseException:
        log(f"failed; worker log tail:\n{worker.tail()}")
        raise
    finally:
        log("stopping the worker")
        worker.stop()
        deleted = cleanup_redis(
            args.redis_url, env["MEDSPLIT_CELERY_QUEUE"], bench.slugs if bench else []
        )
        log(f"deleted {deleted} Redis keys")
        remove_folder(folder, args.keep)
    print_result(result, args.json, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
