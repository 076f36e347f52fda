"""Benchmark: test accuracy of a three-hospital split job with and without augmentation.

Run from the repository root::

    .venv/bin/python bench/bench_augment.py                    # BreastMNIST, seeds 0,1,2
    .venv/bin/python bench/bench_augment.py --seeds 0,1,2,3,4 --json

Method. On BreastMNIST (28x28, from ``../shared/data``), for each seed, one job per
augmentation preset (:data:`PRESETS`), every job the same in all else: a vanilla
:class:`medsplit.training.SplitJob` over three hospitals holding the simulator's deal of
the training split (``medsplit.training.simulate.load_hospitals``), ``small_cnn`` from
the seed's initial weights, ``bench_accuracy.py``'s settings (Adam lr 0.002, cosine
schedule to zero over the job's steps, batch 16, 40 rounds of one local epoch, every
sample once an epoch). The only difference is ``TrainingConfig.augmentation``: MONAI
random transforms on every training batch, drawn per step from the job's seed
(``medsplit.training.augment``), exactly as an agent, ``medsplit simulate`` and the
unsplit reference apply them. Scores: the official test split's accuracy and ROC AUC of
the final weights (nothing selects a checkpoint); differences are each preset minus no
augmentation, seed by seed, in points, then averaged.

The first seed's first augmented job (every seed's with ``--check-all-seeds``) is also
checked against unsplit training over the same (augmented) batch sequence
(``train_unsplit``): every weight must be identical (``torch.equal``). Each job's CPU
time is measured, so the cost of augmenting (per-sample MONAI transforms on the CPU)
shows as a ratio against the job without it, run side by side.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from bench_accuracy import DATA_DIR, Settings, scores_on, split_config, train_split
from report import table, today

from medsplit.data import DataSplit, load_medmnist
from medsplit.models import build_model
from medsplit.training.augment import check_augmentation
from medsplit.training.simulate import SimulationData, SimulationSetup, load_hospitals
from medsplit.training.split_job import Hospital
from medsplit.training.verify import deterministic

HOSPITALS = 3
FILE = "breastmnist_28.npz"
MODE = "vanilla"
#: Augmentation presets by name, each a job's ``augmentation`` list.
PRESETS: dict[str, list[dict]] = {
    "none": [],
    "flip + rotate": [{"name": "flip", "axis": 1}, {"name": "rotate", "degrees": 15}],
    "flip + rotate + intensity": [
        {"name": "flip", "axis": 1},
        {"name": "rotate", "degrees": 15},
        {"name": "shift_intensity", "offset": 0.1},
        {"name": "scale_intensity", "factor": 0.1},
    ],
}


def say(message: str) -> None:
    print(f"bench_augment | {message}", file=sys.stderr, flush=True)


def run_seed(
    path: Path, settings: Settings, seed: int, presets: list[str], *, check: bool, limit: int
) -> dict[str, object]:
    """One job per preset for ``seed``, scored on the test split."""
    setup = SimulationSetup(
        model=settings.model, hospitals=HOSPITALS, data=SimulationData(medmnist=path)
    )
    hospitals = [Hospital(h.name, h.train) for h in load_hospitals(setup, seed=seed)]
    if limit:
        each = max(1, limit // HOSPITALS)
        hospitals = [
            Hospital(h.name, DataSplit(h.train.images[:each], h.train.labels[:each]))
            for h in hospitals
        ]
    test = load_medmnist(path, "test")
    model = build_model(settings.model, seed=seed)
    out: dict[str, object] = {"seed": seed, "train": sum(len(h.train) for h in hospitals)}
    base, steps = split_config(MODE, settings, hospitals, seed)
    with deterministic():
        for name in presets:
            config = replace(base, augmentation=check_augmentation(PRESETS[name]))
            # One check is enough to show it: the seed's first augmented job.
            checking = (
                check
                and bool(config.augmentation)
                and not any(
                    isinstance(v, dict) and v.get("exact_vs_unsplit_same_batches")
                    for v in out.values()
                )
            )
            start, cpu = time.perf_counter(), time.process_time()
            segments, _, exact = train_split(model, hospitals, config, check=checking)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            scores = scores_on(segments, test)
            out[name] = {
                **scores,
                "steps": steps,
                "exact_vs_unsplit_same_batches": exact,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
            }
            say(
                f"seed {seed} {name}: accuracy {scores['accuracy']:.3f}, AUC "
                f"{scores['auc']:.3f}, {steps} steps, {seconds:.1f} s ({cpu_seconds:.1f} s CPU), "
                f"exact={exact}"
            )
    return out


def summarise(per_seed: list[dict], presets: list[str]) -> dict[str, object]:
    """Mean and range over seeds of each score; each preset minus none, in points; the
    time ratio against none (which checked runs exclude: their time holds the check)."""

    def spread(values: list[float]) -> dict[str, float]:
        return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}

    summary: dict[str, object] = {}
    for name in presets:
        runs = [s[name] for s in per_seed]
        entry: dict[str, object] = {m: spread([r[m] for r in runs]) for m in ("accuracy", "auc")}
        if name != "none" and "none" in presets:
            entry["minus_none_points"] = {
                m: spread([100 * (s[name][m] - s["none"][m]) for s in per_seed])
                for m in ("accuracy", "auc")
            }
            timed = [
                s[name]["cpu_seconds"] / s["none"]["cpu_seconds"]
                for s in per_seed
                if s[name]["exact_vs_unsplit_same_batches"] is None
            ]
            entry["time_ratio_vs_none"] = spread(timed) if timed else None
        checked = [r["exact_vs_unsplit_same_batches"] for r in runs]
        entry["exact_checked_runs"] = sum(c is not None for c in checked)
        entry["exact_every_checked_run"] = all(c is not False for c in checked)
        summary[name] = entry
    return summary


def _range(
    s: dict[str, float] | None, *, many: bool, signed: bool = False, fmt: str = ".3f"
) -> str:
    if s is None:
        return "–"
    fmt = "+.1f" if signed else fmt
    digits = 1 if signed else int(fmt[1])
    mean, lo, hi = (round(s[k], digits) + 0.0 for k in ("mean", "min", "max"))
    text = f"{mean:{fmt}}"
    if many:
        text += f" ({lo:{fmt}} to {hi:{fmt}})" if signed else f" ({lo:{fmt}}–{hi:{fmt}})"
    return text.replace("-", "−")


def markdown(result: dict) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    many = len(result["seeds"]) > 1
    rows = []
    summary = result["summary"]
    for name in result["presets"]:
        entry = summary[name]
        points = entry.get("minus_none_points")
        rows.append(
            [
                result["date"],
                name,
                _range(entry["accuracy"], many=many),
                _range(entry["auc"], many=many),
                _range(points["accuracy"], many=many, signed=True) if points else "–",
                _range(points["auc"], many=many, signed=True) if points else "–",
                _range(entry.get("time_ratio_vs_none"), many=many, fmt=".2f") if points else "1",
            ]
        )
    s = result["settings"]
    seeds = ", ".join(str(x) for x in result["seeds"])
    augmented = [n for n in result["presets"] if n != "none"]
    checked = sum(summary[n]["exact_checked_runs"] for n in augmented)
    exact = all(summary[n]["exact_every_checked_run"] for n in augmented)
    described = "; ".join(f"{n}: `{json.dumps(PRESETS[n])}`" for n in augmented)
    measured = (
        f"Measured {result['date']}, `{result['command']}`, torch {result['torch_threads']} "
        f"thread(s), {result['seconds']:.0f} s in all ({result['cpu_seconds']:.0f} s of CPU)."
    )
    return (
        measured
        + "\n\n"
        + table(
            [
                "date",
                "augmentation",
                "test accuracy",
                "test AUC",
                "Δ accuracy vs none (points)",
                "Δ AUC vs none (points)",
                "CPU time vs none",
            ],
            rows,
        )
        + f"\n\n{'Mean over seeds' if many else 'Seed'} {seeds}"
        + (" (range in brackets)" if many else "")
        + f"; Δ is the preset minus no augmentation, seed by seed, in points. BreastMNIST, "
        f"{result['train']} training images dealt to {HOSPITALS} hospitals, {MODE} mode, "
        f"`{s['model']}`, {s['optimizer']} lr {s['lr']} cosine, batch {s['batch_size']}, "
        f"{s['epochs']} rounds of one local epoch. Presets: {described}. Augmented jobs' "
        f"weights identical (`torch.equal`) to unsplit training on the same augmented "
        f"batches: **{'yes' if exact else 'NO'}** (augmented jobs checked: {checked}; their "
        "time, which holds the check, is left out of the ratio). CPU time: the process's "
        "own (`time.process_time`, one torch thread), which a busy machine changes less "
        "than the wall clock."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--epochs", type=int, default=40, help="rounds of one local epoch")
    parser.add_argument(
        "--presets",
        default=",".join(PRESETS),
        help=f"comma-separated, from: {', '.join(PRESETS)} (default: all)",
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="at most this many training images (0: all)"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--check-all-seeds",
        action="store_true",
        help="check a job of every seed against unsplit training (default: the first seed's)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds or min(seeds) < 0:
        parser.error("--seeds needs one or more integers >= 0")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        parser.error(f"unknown preset(s) {unknown}; choose from {', '.join(PRESETS)}")
    path = args.data_dir / FILE
    if not path.is_file():
        print(
            f"bench_augment: {path} is missing; this benchmark needs BreastMNIST in "
            "../shared/data (see its README), or give --data-dir",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    settings = Settings(epochs=args.epochs)
    start, cpu = time.perf_counter(), time.process_time()
    per_seed = [
        run_seed(
            path,
            settings,
            seed,
            presets,
            check=args.check_all_seeds or i == 0,
            limit=args.limit,
        )
        for i, seed in enumerate(seeds)
    ]
    given = " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv) if a != "--json"
    )
    result = {
        "date": today(),
        "command": f".venv/bin/python bench/bench_augment.py {given}".strip(),
        "seeds": seeds,
        "presets": presets,
        "train": per_seed[0]["train"],
        "settings": asdict(settings),
        "per_seed": per_seed,
        "summary": summarise(per_seed, presets),
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "torch_threads": args.threads,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
