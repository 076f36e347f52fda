"""Benchmark: test accuracy of a three-hospital split-learning job against centralized training.

Run from the repository root::

    .venv/bin/python bench/bench_accuracy.py                  # both datasets, seeds 0,1,2
    .venv/bin/python bench/bench_accuracy.py --datasets breastmnist --seeds 0,1,2,3,4
    .venv/bin/python bench/bench_accuracy.py --epochs 20 --json

Method. For each dataset (BreastMNIST and PneumoniaMNIST, 28x28, from ``../shared/data``)
and each seed, three models start from the same initial weights (the registry's
``small_cnn``, built with the seed):

* **centralized**: the whole model trained on the union of the training split, one
  shuffled ``DataLoader`` over all of it (seeded), for E epochs;
* **vanilla** and **U-shaped**: a :class:`medsplit.training.SplitJob` over three
  hospitals, each holding a third of the training split as the simulator deals it out
  (``medsplit.training.simulate.load_hospitals``, i.e. ``medsplit.data.shard``: a seeded
  random deal, not stratified; the JSON lists each hospital's class counts), for E rounds
  of one local epoch each: in every round the hospitals train in turn and hand their
  weights on to the next one. Every step's activations and gradients cross the cut as
  encoded frames through a channel, and every hand-off goes through bytes.

All three use the same optimizer (Adam, cosine schedule to zero over the run's steps),
learning rate, batch size and epochs. Every sample is seen once per epoch in all three
(no dropped last batch), so the split jobs take a few more, shorter steps: each
hospital ends its epoch with a short batch. Scores are the official test split's
accuracy and ROC AUC (MONAI's ``compute_roc_auc``, through
``medsplit.training.evaluate.classification_metrics``) of the final weights; nothing
selects a checkpoint. Differences are split minus centralized in points (hundredths),
seed by seed, then averaged; the goal is that split learning loses at most one point of
either.

The split jobs of the first seed (of every seed with ``--check-all-seeds``) are also
checked against unsplit training over the very same batch sequence
(``medsplit.training.reference.train_unsplit``): every weight must be identical
(``torch.equal``). So any difference from centralized training comes from the order in
which the data is seen (hospital by hospital rather than shuffled together), not from
splitting the network. For the same seed, vanilla and U-shaped jobs see the same
batches, so their weights are identical too, which the run checks.

Settings (the same for the split and the centralized runs). ``small_cnn`` (23k
parameters, GroupNorm, so no running statistics to hand on) trains an epoch in well under
a second on one CPU thread; ResNet-18 would take minutes per run here. With SGD,
BreastMNIST stayed at the majority class (0.731); Adam with lr 0.002, batch 16 and a
cosine schedule over 40 epochs gave the best centralized scores of a small sweep over
three seeds (lr 0.001-0.003, batch 16 or 32, 25-60 epochs); without the schedule the
final accuracy jumped by up to 20 points from one epoch to the next. PneumoniaMNIST has
8.6 times the images, so 5 epochs give about the same number of steps. The sweep looked
at centralized test scores, so the absolute figures are slightly optimistic; the
comparison is not affected, since the split runs use the settings unchanged.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from report import table, today

from medsplit.data import DataSplit, label_counts, load_medmnist
from medsplit.models import build_model, get_model_spec
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import score
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import turn_length
from medsplit.training.simulate import SimulationData, SimulationSetup, load_hospitals
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.training.verify import deterministic

GOAL_POINTS = 1.0
HOSPITALS = 3
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
# name -> (file in the data folder, default epochs). PneumoniaMNIST has 8.6x the images,
# so fewer passes reach the same number of steps.
DATASETS = {
    "breastmnist": ("breastmnist_28.npz", 40),
    "pneumoniamnist": ("pneumoniamnist_28_reconstructed.npz", 5),
}
TITLES = {"breastmnist": "BreastMNIST", "pneumoniamnist": "PneumoniaMNIST"}
SPLIT_MODES = ("vanilla", "ushaped")
RUNS = ("centralized", *SPLIT_MODES)
LABELS = {"centralized": "centralized", "vanilla": "split, vanilla", "ushaped": "split, U-shaped"}


@dataclass(frozen=True)
class Settings:
    """What every run of one dataset shares (the split runs add only the cuts)."""

    model: str = "small_cnn"
    optimizer: str = "adam"
    lr: float = 0.002
    batch_size: int = 16
    epochs: int = 40

    def optimizer_config(self, total_steps: int) -> OptimizerConfig:
        return OptimizerConfig(
            name=self.optimizer, lr=self.lr, schedule="cosine", total_steps=total_steps
        )


def say(message: str) -> None:
    print(f"bench_accuracy | {message}", file=sys.stderr, flush=True)


def scores_on(segments: Sequence[torch.nn.Module], data: DataSplit) -> dict[str, float]:
    """Accuracy and AUC of the segments, run one after another over the test split."""
    metrics = score(segments, data)
    return {"accuracy": metrics["val_accuracy"], "auc": metrics["val_auc"]}


def train_centralized(
    model: torch.nn.Module, train: DataSplit, settings: Settings, seed: int
) -> tuple[torch.nn.Module, int]:
    """The model trained whole over all the data, shuffled by one seeded DataLoader."""
    whole = copy.deepcopy(model)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train.images, train.labels),
        batch_size=settings.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    steps = settings.epochs * len(loader)
    party = Party.create(whole, settings.optimizer_config(steps))
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(settings.epochs):
        for x, y in loader:
            loss_fn(whole(x), y).backward()
            party.step()
    return whole, steps


def split_config(
    mode: str, settings: Settings, hospitals: list[Hospital], seed: int
) -> tuple[TrainingConfig, int]:
    """The job's config; the cosine schedule spans the job's own number of steps."""
    spec = get_model_spec(settings.model)
    cuts = get_mode(mode).default_cuts(spec)
    base = dict(
        cuts=cuts,
        mode=mode,
        batch_size=settings.batch_size,
        rounds=settings.epochs,
        local_epochs=1,
        seed=seed,
        drop_last=False,  # like the DataLoader: every sample is seen every epoch
        job=f"accuracy-{mode}-{seed}",
    )
    probe = TrainingConfig(**base)
    steps = settings.epochs * sum(turn_length(probe, len(h.train)) for h in hospitals)
    optimizer = settings.optimizer_config(steps)
    config = TrainingConfig(**base, client_optimizer=optimizer, server_optimizer=optimizer)
    return config, steps


def train_split(
    model: torch.nn.Module, hospitals: list[Hospital], config: TrainingConfig, *, check: bool
) -> tuple[list[torch.nn.Module], dict[str, torch.Tensor], bool | None]:
    """Run the job; with ``check``, compare its weights with unsplit training on the same
    batches (``None`` when not checked)."""
    job = SplitJob(model, hospitals[0].train.images[:2], config)
    job.run(hospitals)
    got = job.state_dict()
    exact = None
    if check:
        reference = train_unsplit(model, [h.train for h in hospitals], config, job.split)
        exact = _same(got, reference.state_dict())
    return job.segments(), got, exact


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in b)


def run_seed(path: Path, settings: Settings, seed: int, *, check: bool) -> dict[str, object]:
    """Centralized, vanilla and U-shaped training of one seed, scored on the test split."""
    setup = SimulationSetup(
        model=settings.model, hospitals=HOSPITALS, data=SimulationData(medmnist=path)
    )
    # The simulator's hospitals, without their validation shares (not used here).
    hospitals = [Hospital(h.name, h.train) for h in load_hospitals(setup, seed=seed)]
    train = load_medmnist(path, "train")
    test = load_medmnist(path, "test")
    model = build_model(settings.model, seed=seed)
    out: dict[str, object] = {
        "seed": seed,
        "hospital_label_counts": [label_counts(h.train) for h in hospitals],
    }
    with deterministic():
        start = time.perf_counter()
        whole, steps = train_centralized(model, train, settings, seed)
        scores = scores_on([whole], test)
        out["centralized"] = {**scores, "steps": steps, "seconds": time.perf_counter() - start}
        say(f"{path.name} seed {seed} centralized: {_scores(scores)}, {steps} steps")
        weights = {}
        for mode in SPLIT_MODES:
            start = time.perf_counter()
            config, steps = split_config(mode, settings, hospitals, seed)
            segments, weights[mode], exact = train_split(model, hospitals, config, check=check)
            scores = scores_on(segments, test)
            out[mode] = {
                **scores,
                "steps": steps,
                "exact_vs_unsplit_same_batches": exact,
                "seconds": time.perf_counter() - start,
            }
            say(f"{path.name} seed {seed} {mode}: {_scores(scores)}, {steps} steps, exact={exact}")
        # Same seed, same batches, both exact: U-shaped must end where vanilla does.
        out["ushaped_equals_vanilla"] = _same(weights["ushaped"], weights["vanilla"])
    return out


def _scores(scores: dict[str, float]) -> str:
    return f"accuracy {scores['accuracy']:.3f}, AUC {scores['auc']:.3f}"


def summarise(per_seed: list[dict]) -> dict[str, object]:
    """Mean and range over seeds of each score, and of each split-minus-centralized gap."""

    def spread(values: list[float]) -> dict[str, float]:
        return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}

    summary: dict[str, object] = {}
    for run in RUNS:
        summary[run] = {m: spread([s[run][m] for s in per_seed]) for m in ("accuracy", "auc")}
    for mode in RUNS[1:]:
        gaps = {
            m: spread([100 * (s[mode][m] - s["centralized"][m]) for s in per_seed])
            for m in ("accuracy", "auc")
        }
        summary[f"{mode}_minus_centralized_points"] = gaps
        summary[f"{mode}_goal_met"] = all(g["mean"] >= -GOAL_POINTS for g in gaps.values())
        checked = [s[mode]["exact_vs_unsplit_same_batches"] for s in per_seed]
        summary[f"{mode}_exact_checked_runs"] = sum(c is not None for c in checked)
        summary[f"{mode}_exact_every_checked_run"] = all(c is not False for c in checked)
    summary["ushaped_equals_vanilla_every_seed"] = all(
        s["ushaped_equals_vanilla"] for s in per_seed
    )
    return summary


def _range(s: dict[str, float], *, many: bool, signed: bool = False) -> str:
    """``mean (min–max)``; signed figures are points, with a real minus sign."""
    fmt = "+.1f" if signed else ".3f"
    # Adding 0.0 turns a rounded -0.0 into 0.0, so no gap is shown as "−0.0".
    digits = 1 if signed else 3
    mean, lo, hi = (round(s[k], digits) + 0.0 for k in ("mean", "min", "max"))
    text = f"{mean:{fmt}}"
    if many:
        text += f" ({lo:{fmt}} to {hi:{fmt}})" if signed else f" ({lo:{fmt}}–{hi:{fmt}})"
    return text.replace("-", "−")


def markdown(result: dict) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = []
    many = len(result["seeds"]) > 1
    for name, data in result["datasets"].items():
        summary = data["summary"]
        for run in RUNS:
            scores = summary[run]
            if run == "centralized":
                gaps, goal = ["–", "–"], "–"
            else:
                points = summary[f"{run}_minus_centralized_points"]
                gaps = [
                    _range(points["accuracy"], many=many, signed=True),
                    _range(points["auc"], many=many, signed=True),
                ]
                goal = "met" if summary[f"{run}_goal_met"] else "**not met**"
            rows.append(
                [
                    result["date"],
                    TITLES.get(name, name),
                    LABELS[run],
                    _range(scores["accuracy"], many=many),
                    _range(scores["auc"], many=many),
                    *gaps,
                    goal,
                ]
            )
    s = result["settings"]
    seeds = ", ".join(str(x) for x in result["seeds"])
    epochs = ", ".join(
        f"{TITLES.get(k, k)} {v['settings']['epochs']}" for k, v in result["datasets"].items()
    )
    summaries = [d["summary"] for d in result["datasets"].values()]
    exact = all(d[f"{m}_exact_every_checked_run"] for d in summaries for m in RUNS[1:])
    checked = sum(d[f"{m}_exact_checked_runs"] for d in summaries for m in RUNS[1:])
    same = all(d["ushaped_equals_vanilla_every_seed"] for d in summaries)
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
        + "; Δ is split minus centralized, seed by seed, in points (hundredths). "
        f"`{s['model']}`, {s['optimizer']} lr {s['lr']} with a cosine schedule, "
        f"batch {s['batch_size']}, epochs (= rounds of one local epoch): {epochs}; "
        f"{HOSPITALS} hospitals. Split weights identical (`torch.equal`) to unsplit training "
        f"on the same batch sequence: **{'yes' if exact else 'NO'}** ({checked} split runs "
        f"checked); U-shaped weights identical to vanilla ones for every seed: "
        f"**{'yes' if same else 'NO'}**."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets",
        default=",".join(DATASETS),
        help=f"comma-separated, from {', '.join(DATASETS)} (default: all)",
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--epochs",
        type=int,
        help="epochs (= rounds) for every dataset "
        f"(default: {', '.join(f'{k} {v[1]}' for k, v in DATASETS.items())})",
    )
    parser.add_argument("--model", default=Settings.model)
    parser.add_argument("--lr", type=float, default=Settings.lr)
    parser.add_argument("--batch-size", type=int, default=Settings.batch_size)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a busy machine)"
    )
    parser.add_argument(
        "--check-all-seeds",
        action="store_true",
        help="check every split run against unsplit training on its batches (default: the "
        "first seed's runs only; each check costs about one centralized run)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in DATASETS]
    if unknown or not names:
        parser.error(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds or min(seeds) < 0:
        parser.error("--seeds needs one or more integers >= 0")
    for name in names:
        path = args.data_dir / DATASETS[name][0]
        if not path.is_file():
            print(
                f"bench_accuracy: {path} is missing; this benchmark needs the MedMNIST files "
                "in ../shared/data (see its README), or give --data-dir",
                file=sys.stderr,
            )
            return 2
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    datasets = {}
    for name in names:
        file, default_epochs = DATASETS[name]
        settings = Settings(
            model=args.model,
            lr=args.lr,
            batch_size=args.batch_size,
            epochs=args.epochs or default_epochs,
        )
        per_seed = [
            run_seed(args.data_dir / file, settings, seed, check=args.check_all_seeds or i == 0)
            for i, seed in enumerate(seeds)
        ]
        datasets[name] = {
            "file": file,
            "settings": asdict(settings),
            "per_seed": per_seed,
            "summary": summarise(per_seed),
        }
    result = {
        "date": today(),
        "seeds": seeds,
        "hospitals": HOSPITALS,
        "settings": {
            k: v
            for k, v in asdict(Settings(args.model, lr=args.lr, batch_size=args.batch_size)).items()
            if k != "epochs"
        },
        "goal_points": GOAL_POINTS,
        "datasets": datasets,
        "env": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "seconds": time.perf_counter() - start,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
