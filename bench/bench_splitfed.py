"""Benchmark SplitFed (issue 18) in process: accuracy, traffic, masking and round time.

Run from the repository root::

    .venv/bin/python bench/bench_splitfed.py                      # every part, a table each
    .venv/bin/python bench/bench_splitfed.py --parts accuracy --seeds 0,1,2,3,4
    .venv/bin/python bench/bench_splitfed.py --parts traffic,masking,rounds --json

Everything runs in this process through :class:`medsplit.training.split_job.SplitJob`:
every step's frames are encoded and cross an in-memory channel, every SplitFed round
ends in the real secure aggregation (``medsplit.training.parallel``: sealed pair seeds
and group key, masked submissions as bytes to an ``Aggregator``, every hospital
unmasking). Nothing here goes through Redis or Celery: the platform runs the same
arithmetic (exact against this job, ``tests/workers/test_splitfed_job.py``), but its own
round time and traffic are not measured here. Runs: **round-robin** is the vanilla mode (hospitals
in turn, weights handed on); **SFLV1** and **SFLV2** are ``splitfed`` with ``variant``
``v1`` / ``v2``, labels at the server, the same cut (``small_cnn``: ``pool1``).

Parts (``--parts``, all by default), side by side in one run:

* ``accuracy``: SFLV1, SFLV2 and round-robin against centralized training (the whole
  model on the pooled training split, one seeded shuffled loader;
  ``bench_accuracy.train_centralized``) on BreastMNIST and PneumoniaMNIST, three
  hospitals (the simulator's deal), with ``bench_accuracy``'s settings (Adam lr 0.002,
  cosine schedule over the run's steps, batch 16, BreastMNIST 40 epochs, PneumoniaMNIST
  5; an epoch is a round of one local epoch), mean and range over seeds, final weights
  scored on the official test split. SplitFed's fronts (and SFLV1's server copies) start
  every round from the average with a fresh optimizer, as federated averaging does
  (``SplitMode.combine_exported``), so their Adam state and schedule restart each round;
  SFLV2's one server segment keeps its own across rounds.
* ``traffic``: one round's bytes (the round report: every frame of every step both ways,
  plus the masked submissions up and the aggregate down to each hospital) against
  ``2·p·q·b + 2·K·N_c·b′`` (``p`` samples trained in the round over all hospitals, ``q``
  values per sample crossing the cut(s), ``b`` = 4, ``K`` hospitals, ``N_c`` float32
  values of the hospital's segments, ``b′`` = 8); goal ≤ 1.02. Both variants and both
  label placements on ``small_cnn``, and ResNet-18 (cut ``layer1``, 2 steps per turn)
  where the aggregation term is large. The sealed pair seeds and group key of the
  round, which neither the report nor the formula counts, are sized beside it.
* ``masking``: ``bench_secagg.measure`` (mask, aggregator, unmask against a plain sum of
  the same tensors) at the sizes of the fronts above, for K = 3, 5 and 10.
* ``rounds``: the wall time of a round of round-robin, SFLV1 and SFLV2 over the same
  hospitals and steps (PneumoniaMNIST, ``--steps`` per turn), K = 3 and 10, the runs'
  jobs alternating (``--passes``); each step's CPU time and the server's part of it, and
  the secure aggregation's time against a plain weighted sum of the same states, are
  taken in the run (``RoundClock``); the critical path a consortium with one machine per
  hospital would see is computed from them (``critical_path``).

Nothing here asserts on time; the figures are printed (``--json``: as one object).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import bench_accuracy
import bench_secagg
import torch
from bench_accuracy import DATA_DIR, DATASETS, TITLES, Settings
from report import command_line, environment, table, today

from medsplit.data import load_medmnist
from medsplit.models import build_model, get_model_spec
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.roles import StepResult
from medsplit.secagg import RoundId, VectorLayout
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_length
from medsplit.training.simulate import SimulationData, SimulationSetup, load_hospitals
from medsplit.training.split_job import Hospital, RoundReport, SplitJob
from medsplit.training.verify import deterministic

PARTS = ("accuracy", "traffic", "masking", "rounds")
GOAL_POINTS = 1.0
GOAL_TRAFFIC = 1.02
HOSPITALS = 3
B, B_MASKED = 4, 8  # bytes per float32 value at the cut; per masked ring value
# run -> (mode, mode options)
JOBS: dict[str, tuple[str, dict[str, str]]] = {
    "roundrobin": ("vanilla", {}),
    "sflv1": ("splitfed", {"variant": "v1"}),
    "sflv2": ("splitfed", {"variant": "v2"}),
}
RUNS = ("centralized", *JOBS, "centralized_constant_lr")
LABELS = {
    "centralized": "centralized",
    "centralized_constant_lr": "centralized, constant lr (diagnostic)",
    "roundrobin": "round-robin (vanilla)",
    "sflv1": "SFLV1",
    "sflv2": "SFLV2",
}


def say(message: str) -> None:
    print(f"bench_splitfed | {message}", file=sys.stderr, flush=True)


def job_config(
    run: str,
    settings: Settings,
    hospitals: Sequence[Hospital],
    *,
    seed: int,
    rounds: int,
    labels: str = "server",
    max_steps: int | None = None,
    drop_last: bool = False,
    model: str | None = None,
) -> TrainingConfig:
    """The job of ``run`` (a key of ``JOBS``); the cosine schedule spans its steps."""
    mode, options = JOBS[run]
    if mode == "splitfed":
        options = {**options, "labels": labels}
    cuts = (
        get_mode(mode).with_options(options).default_cuts(get_model_spec(model or settings.model))
    )
    base: dict[str, Any] = dict(
        cuts=cuts,
        mode=mode,
        mode_options=options,
        batch_size=settings.batch_size,
        rounds=rounds,
        local_epochs=1,
        max_steps_per_turn=max_steps,
        seed=seed,
        drop_last=drop_last,
        job=f"splitfed-bench-{run}-{seed}",
    )
    probe = TrainingConfig(**base)
    steps = rounds * sum(turn_length(probe, len(h.train)) for h in hospitals)
    optimizer = settings.optimizer_config(steps)
    return replace(probe, client_optimizer=optimizer, server_optimizer=optimizer)


def data_path(folder: Path, name: str) -> Path:
    return folder / DATASETS[name][0]


def dealt_hospitals(path: Path, model: str, seed: int, hospitals: int) -> list[Hospital]:
    """The simulator's deal of the training split to ``hospitals`` hospitals (their
    validation shares dropped)."""
    setup = SimulationSetup(model=model, hospitals=hospitals, data=SimulationData(medmnist=path))
    return [Hospital(h.name, h.train) for h in load_hospitals(setup, seed=seed)]


# -- accuracy ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConstantLr(Settings):
    """The same settings without the schedule: the learning rate SplitFed's fronts see,
    since their schedule restarts every round (a diagnostic, not a goal)."""

    def optimizer_config(self, total_steps: int) -> OptimizerConfig:
        return replace(super().optimizer_config(total_steps), schedule="constant")


def accuracy_seed(path: Path, settings: Settings, seed: int) -> dict[str, Any]:
    """Centralized, round-robin, SFLV1 and SFLV2 of one seed, scored on the test split."""
    hospitals = dealt_hospitals(path, settings.model, seed, HOSPITALS)
    train, test = load_medmnist(path, "train"), load_medmnist(path, "test")
    model = build_model(settings.model, seed=seed)
    out: dict[str, Any] = {"seed": seed}
    with deterministic():
        start = time.perf_counter()
        whole, steps = bench_accuracy.train_centralized(model, train, settings, seed)
        out["centralized"] = {
            **bench_accuracy.scores_on([whole], test),
            "steps": steps,
            "seconds": time.perf_counter() - start,
        }
        start = time.perf_counter()
        constant = ConstantLr(**asdict(settings))
        whole, steps = bench_accuracy.train_centralized(model, train, constant, seed)
        out["centralized_constant_lr"] = {
            **bench_accuracy.scores_on([whole], test),
            "steps": steps,
            "seconds": time.perf_counter() - start,
        }
        for run in JOBS:
            start = time.perf_counter()
            config = job_config(run, settings, hospitals, seed=seed, rounds=settings.epochs)
            job = SplitJob(model, hospitals[0].train.images[:2], config)
            reports = job.run(hospitals)
            out[run] = {
                **bench_accuracy.scores_on(job.segments(), test),
                "steps": sum(r.steps for r in reports),
                "seconds": time.perf_counter() - start,
            }
    say(
        f"{path.name} seed {seed}: "
        + ", ".join(f"{run} {out[run]['accuracy']:.3f}/{out[run]['auc']:.3f}" for run in RUNS)
    )
    return out


def accuracy_summary(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and range over seeds of each score and of each run-minus-centralized gap."""

    def spread(values: list[float]) -> dict[str, float]:
        return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}

    summary: dict[str, Any] = {}
    for run in RUNS:
        summary[run] = {m: spread([s[run][m] for s in per_seed]) for m in ("accuracy", "auc")}
    for run in RUNS[1:]:
        gaps = {
            m: spread([100 * (s[run][m] - s["centralized"][m]) for s in per_seed])
            for m in ("accuracy", "auc")
        }
        summary[f"{run}_minus_centralized_points"] = gaps
        summary[f"{run}_goal_met"] = all(g["mean"] >= -GOAL_POINTS for g in gaps.values())
    return summary


def measure_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    datasets = {}
    for name in args.datasets:
        settings = Settings(
            model=args.model,
            lr=args.lr,
            batch_size=args.batch_size,
            epochs=args.epochs or DATASETS[name][1],
        )
        per_seed = [accuracy_seed(data_path(args.data_dir, name), settings, s) for s in args.seeds]
        datasets[name] = {
            "settings": asdict(settings),
            "per_seed": per_seed,
            "summary": accuracy_summary(per_seed),
        }
    return {"seeds": args.seeds, "hospitals": HOSPITALS, "datasets": datasets}


# -- traffic -----------------------------------------------------------------------------


def hospital_values(job: SplitJob) -> int:
    """``N_c``: the float32 values of the hospital's segments (what is masked)."""
    return sum(
        v.numel()
        for party in job.client_parties().values()
        for v in party.module.state_dict().values()
        if v.dtype == torch.float32
    )


def cut_values(job: SplitJob) -> int:
    """``q``: the values per sample crossing the cut(s), one way."""
    return sum(t.numel for cut in job.split.boundaries for t in cut)


def exchange_bytes(k: int, n_c: int) -> int:
    """The bytes of one round's sealed secrets (K(K - 1)/2 pair seeds, K - 1 group keys),
    which the relay carries besides what the formula counts; the round report leaves
    them out."""
    names = [f"h{i:02d}" for i in range(k)]
    keys = bench_secagg.make_keys(bench_secagg.JOB, names)
    round_id = RoundId(bench_secagg.JOB, 0, 0, {h: 1 for h in names})
    layout = VectorLayout.of({"front": torch.zeros(n_c)})
    rounds = bench_secagg.hospital_rounds(round_id, keys, layout)
    return sum(len(secret.blob) for side in rounds.values() for secret in side.outgoing())


# (model, run, labels, steps per turn or None for a whole local epoch)
TRAFFIC_CASES: tuple[tuple[str, str, str, int | None], ...] = (
    ("small_cnn", "sflv1", "server", None),
    ("small_cnn", "sflv2", "server", None),
    ("small_cnn", "sflv1", "hospital", None),
    ("small_cnn", "sflv2", "hospital", None),
    ("resnet18", "sflv1", "server", 2),
)


def traffic_case(
    path: Path, model_name: str, run: str, labels: str, max_steps: int | None, seed: int
) -> dict[str, Any]:
    """One round of a SplitFed job: its bytes against the analytic cost."""
    settings = Settings(model=model_name, epochs=1)
    hospitals = dealt_hospitals(path, model_name, seed, HOSPITALS)
    # drop_last: a batch of one would stop ResNet-18's batch norm; the cost counts p anyway.
    config = job_config(
        run,
        settings,
        hospitals,
        seed=seed,
        rounds=1,
        labels=labels,
        max_steps=max_steps,
        drop_last=True,
        model=model_name,
    )
    model = build_model(model_name, spatial_dims=2, in_channels=1, num_classes=2, seed=seed)
    job = SplitJob(model, hospitals[0].train.images[:2], config)
    steps = {"up": 0, "down": 0}

    def on_step(result: StepResult) -> None:
        steps["up"] += result.bytes_up
        steps["down"] += result.bytes_down

    (report,) = job.run(hospitals, on_step=on_step)
    p, q, n_c = report.samples, cut_values(job), hospital_values(job)
    cut_cost, agg_cost = 2 * p * q * B, 2 * HOSPITALS * n_c * B_MASKED
    measured = report.bytes_up + report.bytes_down
    step_bytes = steps["up"] + steps["down"]
    exchange = exchange_bytes(HOSPITALS, n_c)
    return {
        "model": model_name,
        "run": run,
        "labels": labels,
        "cuts": list(config.cuts),
        "hospitals": HOSPITALS,
        "p": p,
        "q": q,
        "n_c": n_c,
        "analytic_bytes": cut_cost + agg_cost,
        "analytic_cut_bytes": cut_cost,
        "analytic_aggregation_bytes": agg_cost,
        "measured_bytes": measured,
        "measured_step_bytes": step_bytes,
        "measured_aggregation_bytes": measured - step_bytes,
        "ratio": measured / (cut_cost + agg_cost),
        "step_ratio": step_bytes / cut_cost,
        "aggregation_ratio": (measured - step_bytes) / agg_cost,
        "goal_met": measured / (cut_cost + agg_cost) <= GOAL_TRAFFIC,
        "key_exchange_bytes": exchange,
        "ratio_with_key_exchange": (measured + exchange) / (cut_cost + agg_cost),
    }


def measure_traffic(args: argparse.Namespace) -> dict[str, Any]:
    path = data_path(args.data_dir, "breastmnist")
    cases = []
    for model_name, run, labels, steps in TRAFFIC_CASES:
        with deterministic():
            case = traffic_case(path, model_name, run, labels, steps, args.seeds[0])
        say(f"traffic {model_name} {run} labels={labels}: ratio {case['ratio']:.4f}")
        cases.append(case)
    return {"data": "BreastMNIST", "cases": cases}


# -- masking -----------------------------------------------------------------------------


def front_sizes(seed: int) -> dict[str, int]:
    """``N_c`` of the fronts masked in the other parts: small_cnn's and ResNet-18's."""
    sizes = {}
    for name in ("small_cnn", "resnet18"):
        model = build_model(name, spatial_dims=2, in_channels=1, num_classes=2, seed=seed)
        x = torch.zeros(2, 1, 28, 28)
        cuts = get_mode("splitfed").default_cuts(get_model_spec(name))
        config = TrainingConfig(cuts=cuts, mode="splitfed")
        sizes[name] = hospital_values(SplitJob(model, x, config))
    return sizes


def measure_masking(args: argparse.Namespace) -> dict[str, Any]:
    sizes = front_sizes(args.seeds[0])
    keys = bench_secagg.make_keys(bench_secagg.JOB, [f"h{i:02d}" for i in range(max(args.ks))])
    rows = []
    for name, size in sizes.items():
        for k in args.ks:
            row = {"front": name, **bench_secagg.measure(k, size, args.repeats, keys)}
            say(f"masking {name} ({size} values) K={k}: round/plain {row['round_ratio']:.1f}")
            rows.append(row)
    return {"sizes": sizes, "rows": rows}


# -- round wall time ---------------------------------------------------------------------


class RoundClock:
    """Times a job's steps (by hospital), its server's part of them, and its secure
    aggregation against a plain weighted sum of the same states.

    It wraps, on the instances, the client roles' ``start`` (a step's beginning), the
    server roles' ``handle`` and the secure aggregation's ``average``; what they compute
    is untouched.
    """

    def __init__(self, job: SplitJob) -> None:
        self.rounds: list[dict[str, Any]] = []
        self._new_round()
        self._round_start = self._step_start = time.perf_counter()
        self._step_cpu = time.thread_time()
        self._round_cpu = time.process_time()
        job.mode = copy.copy(job.mode)  # the registry's instance stays unwrapped
        make_client = job.mode.client_role

        def timed_client(*args: Any, **kwargs: Any) -> Any:
            role = make_client(*args, **kwargs)
            start = role.start

            def timed_start(*step: Any) -> Any:
                self._step_start = time.perf_counter()
                self._step_cpu = time.thread_time()
                return start(*step)

            role.start = timed_start
            return role

        job.mode.client_role = timed_client  # type: ignore[method-assign]
        make_role = job._server_role

        def timed_role(*args: Any, **kwargs: Any) -> Any:
            role = make_role(*args, **kwargs)
            handle = role.handle

            def timed_handle(frame: Any) -> Any:
                start = time.thread_time()
                try:
                    return handle(frame)
                finally:
                    self.rounds[-1]["server_cpu_s"] += time.thread_time() - start

            role.handle = timed_handle
            return role

        job._server_role = timed_role  # type: ignore[method-assign]
        make_secure = job.secure_aggregation

        def timed_secure(hospitals: Sequence[str]) -> Any:
            secure = make_secure(hospitals)
            if not getattr(secure, "_bench_timed", False):
                average = secure.average

                def timed_average(round_: int, states: Mapping, weights: Mapping) -> Any:
                    start = time.perf_counter()
                    out = average(round_, states, weights)
                    self.rounds[-1]["secure_s"] = time.perf_counter() - start
                    self.rounds[-1]["plain_s"] = plain_weighted_sum(states, weights)
                    return out

                secure.average = timed_average
                secure._bench_timed = True
            return secure

        job.secure_aggregation = timed_secure  # type: ignore[method-assign]

    def _new_round(self) -> None:
        self.rounds.append(
            {
                "turn_s": defaultdict(float),
                "turn_cpu_s": defaultdict(float),
                "server_cpu_s": 0.0,
                "secure_s": 0.0,
                "plain_s": 0.0,
            }
        )

    def on_step(self, result: StepResult) -> None:
        now = time.perf_counter()
        # From the client's start of the step: the turns' setup (copies of the state and
        # of the server segment, made for every turn at once in a parallel round) is not
        # any one hospital's step.
        self.rounds[-1]["turn_s"][result.ids.position] += now - self._step_start
        cpu = time.thread_time() - self._step_cpu
        self.rounds[-1]["turn_cpu_s"][result.ids.position] += cpu

    def on_round(self, report: RoundReport) -> None:
        now = time.perf_counter()
        self.rounds[-1]["wall_s"] = now - self._round_start
        self.rounds[-1]["cpu_s"] = time.process_time() - self._round_cpu
        self._round_cpu = time.process_time()
        for key in ("turn_s", "turn_cpu_s"):
            self.rounds[-1][key] = dict(self.rounds[-1][key])
        self._round_start = now
        self._new_round()


def plain_weighted_sum(states: Mapping[str, Mapping[str, torch.Tensor]], weights: Mapping) -> float:
    """Seconds for ``Σ n_i s_i / Σ n_i`` over the same float32 tensors, in the clear."""
    start = time.perf_counter()
    names = list(states)
    total = sum(weights.values())
    for key, first in states[names[0]].items():
        if first.dtype != torch.float32:
            continue
        acc = first * weights[names[0]]
        for name in names[1:]:
            acc += states[name][key] * weights[name]
        acc /= total
    return time.perf_counter() - start


def critical_path(run: str, rnd: dict[str, Any], agg_s: float) -> float:
    """A round's critical path with one machine per hospital (and the server its own),
    from the CPU time of each step in this process (a machine of one's own has no other
    session's load; the in-memory channel has no latency, which a network adds to every
    step alike).

    Round-robin: the turns one after another (the protocol is sequential). SFLV1: the
    slowest hospital's turn (each turn has its own copy of the server segment, served by
    its own worker) plus one hospital's mask, the aggregator and one hospital's unmask
    (``agg_s``). SFLV2: the one server segment serves every step, so at least the larger
    of the slowest turn and the server's time over all steps, plus ``agg_s`` (a lower
    bound: a hospital's own share of a step cannot overlap the server's share of it).
    """
    turns = list(rnd["turn_cpu_s"].values())
    if run == "roundrobin":
        return sum(turns)
    if run == "sflv1":
        return max(turns) + agg_s
    return max(max(turns), rnd["server_cpu_s"]) + agg_s


def aggregation_critical_s(row: Mapping[str, Any]) -> float:
    """A round's aggregation on its critical path, from a ``bench_secagg.measure`` row:
    one hospital's mask, the aggregator, one hospital's unmask, and the leader's share of
    the key exchange (it seals its K - 1 pair seeds and K - 1 group keys: taking sealing
    and opening as equally costly, 2/(K + 2) of sealing and opening all the round's
    K(K - 1)/2 + K - 1 secrets). The exchange depends on no weights, so a platform could
    run it during the turns; it is counted anyway."""
    k = row["hospitals"]
    exchange = row["exchange_ms"] * 2 / (k + 2)
    return (row["mask_ms"] + row["aggregator_ms"] + row["unmask_ms"] + exchange) / 1e3


def measure_rounds(args: argparse.Namespace, masking: dict[str, Any] | None) -> dict[str, Any]:
    """Round wall times over the same hospitals and steps; critical paths from them."""
    path = data_path(args.data_dir, "pneumoniamnist")
    settings = Settings(model="small_cnn")
    seed = args.seeds[0]
    keys = None
    configs = []
    for k in args.round_ks:
        hospitals = dealt_hospitals(path, settings.model, seed, k)
        model = build_model(settings.model, seed=seed)
        agg = next(
            (
                r
                for r in (masking or {}).get("rows", [])
                if r["front"] == "small_cnn" and r["hospitals"] == k
            ),
            None,
        )
        if agg is None:  # this K was not in the masking part: measure it here
            size = front_sizes(seed)["small_cnn"]
            keys = keys or bench_secagg.make_keys(
                bench_secagg.JOB, [f"h{i:02d}" for i in range(max(args.round_ks))]
            )
            agg = bench_secagg.measure(k, size, args.repeats, keys)
        agg_s = aggregation_critical_s(agg)
        measured: dict[str, list[dict[str, Any]]] = {run: [] for run in JOBS}
        for _ in range(args.passes):  # the runs alternate, so that load hits them alike
            for run in JOBS:
                config = job_config(
                    run, settings, hospitals, seed=seed, rounds=args.rounds, max_steps=args.steps
                )
                job = SplitJob(model, hospitals[0].train.images[:2], config)
                clock = RoundClock(job)
                job.run(hospitals, on_step=clock.on_step, on_round=clock.on_round)
                measured[run] += clock.rounds[1 : args.rounds]  # the first warms up: dropped
        runs = {}
        for run, rounds in measured.items():
            runs[run] = {
                "round_wall_s": statistics.median(r["wall_s"] for r in rounds),
                "round_cpu_s": statistics.median(r["cpu_s"] for r in rounds),
                "slowest_turn_s": statistics.median(max(r["turn_s"].values()) for r in rounds),
                "slowest_turn_cpu_s": statistics.median(
                    max(r["turn_cpu_s"].values()) for r in rounds
                ),
                "sum_turns_cpu_s": statistics.median(sum(r["turn_cpu_s"].values()) for r in rounds),
                "server_cpu_s": statistics.median(r["server_cpu_s"] for r in rounds),
                "secure_s": statistics.median(r["secure_s"] for r in rounds),
                "plain_sum_s": statistics.median(r["plain_s"] for r in rounds),
                "critical_path_s": statistics.median(critical_path(run, r, agg_s) for r in rounds),
                "rounds_measured": len(rounds),
            }
            say(f"rounds K={k} {run}: {runs[run]['round_wall_s']:.2f} s a round")
        base = runs["roundrobin"]
        for run in ("sflv1", "sflv2"):
            runs[run]["wall_vs_roundrobin"] = runs[run]["round_wall_s"] / base["round_wall_s"]
            runs[run]["critical_vs_roundrobin"] = (
                runs[run]["critical_path_s"] / base["critical_path_s"]
            )
        configs.append(
            {
                "hospitals": k,
                "steps_per_turn": args.steps,
                "aggregation_critical_s": agg_s,
                "runs": runs,
            }
        )
    return {
        "data": "PneumoniaMNIST",
        "rounds": args.rounds,
        "passes": args.passes,
        "steps_per_turn": args.steps,
        "batch_size": settings.batch_size,
        "configurations": configs,
    }


# -- the report --------------------------------------------------------------------------


def _pm(summary: dict[str, float], *, many: bool, signed: bool = False) -> str:
    return bench_accuracy._range(summary, many=many, signed=signed)


def accuracy_markdown(part: dict[str, Any], date: str) -> str:
    rows = []
    many = len(part["seeds"]) > 1
    for name, data in part["datasets"].items():
        summary = data["summary"]
        for run in RUNS:
            if run == "centralized":
                gaps, goal = ["–", "–"], "–"
            else:
                points = summary[f"{run}_minus_centralized_points"]
                gaps = [_pm(points[m], many=many, signed=True) for m in ("accuracy", "auc")]
                goal = "met" if summary[f"{run}_goal_met"] else "**not met**"
                goal = "(no goal)" if run == "centralized_constant_lr" else goal
            rows.append(
                [
                    date,
                    TITLES.get(name, name),
                    LABELS[run],
                    _pm(summary[run]["accuracy"], many=many),
                    _pm(summary[run]["auc"], many=many),
                    *gaps,
                    goal,
                ]
            )
    epochs = ", ".join(
        f"{TITLES.get(k, k)} {v['settings']['epochs']}" for k, v in part["datasets"].items()
    )
    s = next(iter(part["datasets"].values()))["settings"]
    seeds = ", ".join(str(x) for x in part["seeds"])
    return (
        table(
            [
                "date",
                "dataset",
                "training",
                "test accuracy",
                "test AUC",
                "Δ accuracy (points)",
                "Δ AUC (points)",
                f"goal (Δ ≥ −{GOAL_POINTS:g})",
            ],
            rows,
        )
        + f"\n\n{'Mean over seeds' if many else 'Seed'} {seeds}"
        + (" (range in brackets)" if many else "")
        + f"; Δ is the run minus centralized, seed by seed, in points. `{s['model']}`, "
        f"{s['optimizer']} lr {s['lr']} cosine, batch {s['batch_size']}, epochs (= rounds of "
        f"one local epoch): {epochs}; {part['hospitals']} hospitals."
    )


def traffic_markdown(part: dict[str, Any]) -> str:
    rows = [
        [
            c["model"],
            LABELS[c["run"]],
            c["labels"],
            " / ".join(c["cuts"]),
            f"{c['p']:,}",
            f"{c['q']:,}",
            f"{c['n_c']:,}",
            f"{c['analytic_bytes']:,}",
            f"{c['measured_bytes']:,}",
            f"**{c['ratio']:.4f}**",
            f"{c['step_ratio']:.4f}",
            f"{c['aggregation_ratio']:.4f}",
            f"{c['key_exchange_bytes']:,}",
            f"{c['ratio_with_key_exchange']:.4f}",
            "met" if c["goal_met"] else "**not met**",
        ]
        for c in part["cases"]
    ]
    return table(
        [
            "model",
            "run",
            "labels at",
            "cut(s)",
            "p",
            "q",
            "N_c",
            "analytic bytes",
            "measured bytes",
            "ratio",
            "steps / 2pqb",
            "aggregation / 2KN_cb′",
            "key exchange bytes (not in the report)",
            "ratio with them",
            f"goal (≤ {GOAL_TRAFFIC})",
        ],
        rows,
    ) + (f"\n\nOne round, {HOSPITALS} hospitals, {part['data']}, batch 16, codec `none`.")


def masking_markdown(part: dict[str, Any]) -> str:
    rows = [
        [
            f"{r['front']} ({r['parameters']:,})",
            r["hospitals"],
            f"{r['plain_ms']:.3f}",
            f"{r['aggregator_ms']:.2f}",
            f"{r['mask_ms']:.2f}",
            f"{r['unmask_ms']:.2f}",
            f"**{r['round_ratio']:.0f}**",
            r["secrets_sealed"],
            f"{r['exchange_ms']:.0f}",
        ]
        for r in part["rows"]
    ]
    repeats = part["rows"][0]["repeats"] if part["rows"] else 0
    return (
        table(
            [
                "front (values)",
                "K",
                "plain sum ms",
                "aggregator ms",
                "mask ms (1 hospital)",
                "unmask ms (1 hospital)",
                "(mask + aggregator + unmask) / plain",
                "secrets sealed",
                "seal + open all ms",
            ],
            rows,
        )
        + f"\n\n`bench_secagg.measure`, medians of {repeats} interleaved rounds."
    )


def rounds_markdown(part: dict[str, Any]) -> str:
    rows = []
    for conf in part["configurations"]:
        for run, r in conf["runs"].items():
            rows.append(
                [
                    conf["hospitals"],
                    LABELS[run],
                    f"{r['round_wall_s']:.2f}",
                    f"{r['round_cpu_s']:.2f}",
                    f"{r['wall_vs_roundrobin']:.2f}" if "wall_vs_roundrobin" in r else "1",
                    f"{r['slowest_turn_cpu_s']:.3f}",
                    f"{r['server_cpu_s']:.2f}",
                    f"{r['secure_s'] * 1e3:.0f}" if run != "roundrobin" else "–",
                    f"{r['plain_sum_s'] * 1e3:.2f}" if run != "roundrobin" else "–",
                    f"{r['critical_path_s']:.2f}",
                    f"**{r['critical_vs_roundrobin']:.2f}**"
                    if "critical_vs_roundrobin" in r
                    else "1",
                ]
            )
    return table(
        [
            "K",
            "run",
            "round wall s (in process)",
            "its CPU s",
            "wall / round-robin",
            "slowest turn CPU s",
            "server's part CPU s",
            "secure aggregation ms (all K, in process)",
            "plain weighted sum ms",
            "critical path s (a machine each)",
            "critical path / round-robin",
        ],
        rows,
    ) + (
        f"\n\n{part['data']}, `small_cnn`, batch {part['batch_size']}, "
        f"{part['steps_per_turn']} steps per turn; medians of rounds 2 to {part['rounds']} "
        f"(the first dropped as warm-up) of {part.get('passes', 1)} jobs per run, the runs "
        "alternating."
    )


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    out = [
        f"Measured {result['date']}, `{result['command']}`, torch {result['env']['threads']} "
        f"thread, {result['env']['cpus']} CPUs, {result['seconds']:.0f} s in all."
    ]
    renderers: dict[str, Callable[[dict[str, Any]], str]] = {
        "accuracy": lambda p: accuracy_markdown(p, result["date"]),
        "traffic": traffic_markdown,
        "masking": masking_markdown,
        "rounds": rounds_markdown,
    }
    titles = {
        "accuracy": "Accuracy against centralized training",
        "traffic": "Traffic per round against 2·p·q·b + 2·K·N_c·b′",
        "masking": "Cost of masking against a plain sum",
        "rounds": "Round wall time and critical path",
    }
    for part in PARTS:
        if part in result["parts"]:
            out.append(f"**{titles[part]}**\n\n{renderers[part](result['parts'][part])}")
    return "\n\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {', '.join(PARTS)}")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="accuracy's datasets")
    parser.add_argument("--seeds", default="0,1,2", help="accuracy's seeds (the first: others)")
    parser.add_argument("--epochs", type=int, help="accuracy's epochs for every dataset")
    parser.add_argument("--model", default=Settings.model, help="accuracy's model")
    parser.add_argument("--lr", type=float, default=Settings.lr)
    parser.add_argument("--batch-size", type=int, default=Settings.batch_size)
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5, 10], help="masking's K")
    parser.add_argument("--repeats", type=int, default=5, help="masking's rounds per K")
    parser.add_argument("--round-ks", type=int, nargs="+", default=[3, 10], help="rounds' K")
    parser.add_argument("--steps", type=int, default=20, help="rounds' steps per turn")
    parser.add_argument("--rounds", type=int, default=4, help="rounds' rounds (first dropped)")
    parser.add_argument("--passes", type=int, default=2, help="rounds' jobs per run, alternating")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.datasets = [n.strip() for n in args.datasets.split(",") if n.strip()]
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")
    if not args.datasets or set(args.datasets) - set(DATASETS):
        parser.error(f"--datasets: choose from {', '.join(DATASETS)}")
    if not args.seeds or min(args.seeds) < 0:
        parser.error("--seeds needs one or more integers >= 0")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first is dropped as warm-up)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    needed = set(args.datasets) if "accuracy" in args.parts else set()
    needed |= {"breastmnist"} if "traffic" in args.parts else set()
    needed |= {"pneumoniamnist"} if "rounds" in args.parts else set()
    for name in sorted(needed):
        if not data_path(args.data_dir, name).is_file():
            print(
                f"bench_splitfed: {data_path(args.data_dir, name)} is missing; this benchmark "
                "needs the MedMNIST files in ../shared/data, or give --data-dir",
                file=sys.stderr,
            )
            return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    parts: dict[str, Any] = {}
    for part in PARTS:
        if part not in args.parts:
            continue
        begun = time.perf_counter()
        if part == "accuracy":
            parts[part] = measure_accuracy(args)
        elif part == "traffic":
            parts[part] = measure_traffic(args)
        elif part == "masking":
            parts[part] = measure_masking(args)
        else:
            parts[part] = measure_rounds(args, parts.get("masking"))
        parts[part]["seconds"] = time.perf_counter() - begun
        say(f"{part} done in {parts[part]['seconds']:.0f} s")
    result = {
        "date": today(),
        "command": command_line("bench_splitfed.py", argv),
        "parts": parts,
        "env": environment(),
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
