"""Benchmark the defenses (issue 22): the privacy–utility frontier at two cuts.

Run from the repository root::

    .venv/bin/python bench/bench_privacy_frontier.py --json > frontier.json
    .venv/bin/python bench/bench_privacy_frontier.py --plot docs/privacy_frontier.png

For BreastMNIST and PneumoniaMNIST (``../shared/data``) and two first cuts of
``small_cnn`` (``conv1``, ``pool2``), each point is one defense at one strength (or none)
in a one-hospital U-shaped job (second cut ``pool``, so that the labels stay home and
the norm attack has gradients to read; a label-noise point, which needs the labels at
the server, would run vanilla): the split trains ``--train-steps`` steps (Adam lr 0.002, batch
32) and the trained model is scored on the official test split (accuracy, ROC AUC,
without noise: the hospital's own inference), then :func:`medsplit.privacy.audit_cut`
trains the same job again (same seed, same steps: the same front) and attacks what
crosses: inversion SSIM of the val split from the activations as sent, and the norm
attack's AUC on the gradients sent up; ε is the whole job's at the hospital (opacus'
RDP accountant, δ = 1e-5).

The figures are read as ratios against the undefended row measured in the same run.
Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from report import command_line, environment, table, today

from medsplit.data import DataSplit, load_medmnist
from medsplit.defenses import PrivacyOptions
from medsplit.models import build_model
from medsplit.privacy import AuditSettings, InversionSettings, audit_cut
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import score
from medsplit.training.split_job import Hospital, SplitJob

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {
    "breastmnist": "breastmnist_28.npz",
    "pneumoniamnist": "pneumoniamnist_28_reconstructed.npz",
}
TITLES = {"breastmnist": "BreastMNIST", "pneumoniamnist": "PneumoniaMNIST"}
CUTS = ("conv1", "pool2")
SECOND_CUT = "pool"
#: (name, strength label, privacy options): the points of the frontier.
POINTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("none", "-", {}),
    (
        "activation_noise",
        "σ=0.5",
        {"activation_noise": {"clip_norm": 5.0, "noise_multiplier": 0.5}},
    ),
    ("activation_noise", "σ=2", {"activation_noise": {"clip_norm": 5.0, "noise_multiplier": 2.0}}),
    ("nopeek", "w=5", {"nopeek": {"weight": 5.0}}),
    ("gradient_noise", "s=4", {"gradient_noise": {"scale": 4.0}}),
)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--cuts", default=",".join(CUTS), help="first cuts, comma separated")
    parser.add_argument("--train-steps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60, help="the inverse network's steps")
    parser.add_argument("--limit", type=int, default=256, help="first N train/val/test records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--plot", type=Path, help="write the frontier as a PNG here")
    parser.add_argument(
        "--from-json", type=Path, nargs="+", help="render results measured before (merged)"
    )
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def _config(cut: str, privacy: Mapping[str, Any], args: argparse.Namespace) -> TrainingConfig:
    adam = OptimizerConfig(name="adam", lr=0.002)
    vanilla = "label_noise" in privacy
    return TrainingConfig(
        cuts=(cut,) if vanilla else (cut, SECOND_CUT),
        mode="vanilla" if vanilla else "ushaped",
        client_optimizer=adam,
        server_optimizer=adam,
        batch_size=32,
        seed=args.seed,
        local_epochs=100,
        max_steps_per_turn=args.train_steps,
        privacy=PrivacyOptions.from_json(dict(privacy)),
    )


def _first(split: DataSplit, n: int | None) -> DataSplit:
    return split if not n else DataSplit(split.images[:n], split.labels[:n])


def _point(
    splits: Mapping[str, DataSplit], cut: str, privacy: Mapping[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    begun = time.perf_counter()
    config = _config(cut, privacy, args)
    model = build_model("small_cnn", in_channels=1, num_classes=2, seed=args.seed)
    job = SplitJob(model, splits["train"].images[:2], config, num_classes=2)
    job.run([Hospital("h0", splits["train"])])
    test = score(job.segments(), splits["test"])
    settings = AuditSettings(
        train_steps=args.train_steps,
        inversion=InversionSettings(steps=args.steps, seed=args.seed),
    )
    model = build_model("small_cnn", in_channels=1, num_classes=2, seed=args.seed)
    report = audit_cut(model, splits["train"], splits["val"], config, settings)
    leak = report.label_leakage or {}
    return {
        "test_accuracy": test["val_accuracy"],
        "test_auc": test.get("val_auc"),
        "ssim": report.ssim,
        "baseline_ssim": report.baseline_ssim,
        "distance_correlation": report.distance_correlation,
        "norm_auc": leak.get("norm_strength"),
        "epsilon": report.epsilon["epsilon"] if report.epsilon else None,
        "mode": config.mode,
        "seconds": time.perf_counter() - begun,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.datasets:
        path = args.data_dir / DATASETS[name]
        splits = {s: _first(load_medmnist(path, s), args.limit) for s in ("train", "val", "test")}
        rows = []
        for cut in args.cuts.split(","):
            for defense, strength, privacy in POINTS:
                row = {"cut": cut, "defense": defense, "strength": strength}
                row.update(_point(splits, cut, privacy, args))
                rows.append(row)
                say(
                    f"{name} {cut} {defense} {strength}: acc {row['test_accuracy']:.3f} "
                    f"SSIM {row['ssim']:.3f} norm strength {_fig(row['norm_auc'])} "
                    f"ε {_fig(row['epsilon'])} ({row['seconds']:.0f} s)"
                )
        out[name] = {"records": {s: len(v) for s, v in splits.items()}, "rows": rows}
    return out


def _fig(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0:
        return ""
    return f" ({value / base:.2f}×)"


def markdown(result: Mapping[str, Any]) -> str:
    lines = [
        f"Measured {result['date']} with `{result['command']}` "
        f"({result['train_steps']} training steps, the inverse network {result['steps']} "
        f"steps, the first {result['limit']} records of each split; ratios against the "
        "undefended row of the same cut).",
        "",
    ]
    for name, data in result["datasets"].items():
        lines.append(f"**{TITLES[name]}**")
        lines.append("")
        rows = []
        for cut in dict.fromkeys(r["cut"] for r in data["rows"]):
            mine = [r for r in data["rows"] if r["cut"] == cut]
            base = mine[0]
            for r in mine:
                rows.append(
                    (
                        cut,
                        f"{r['defense']} {r['strength']}".strip(" -"),
                        r["mode"],
                        _fig(r["test_accuracy"])
                        + _ratio(r["test_accuracy"], base["test_accuracy"]),
                        _fig(r["test_auc"]),
                        _fig(r["ssim"]) + _ratio(r["ssim"], base["ssim"]),
                        _fig(r["norm_auc"]),
                        _fig(r["epsilon"]) if r["epsilon"] is not None else "∞",
                    )
                )
        headers = (
            "cut",
            "defense",
            "mode",
            "test acc",
            "test AUC",
            "inversion SSIM",
            "norm-attack strength",
            "ε",
        )
        lines += [table(headers, rows), ""]
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["datasets"])
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 9), squeeze=False)
    markers = {
        "none": "o",
        "activation_noise": "s",
        "nopeek": "^",
        "gradient_noise": "D",
        "label_noise": "v",
    }
    for col, name in enumerate(names):
        rows = result["datasets"][name]["rows"]
        for row_index, (key, label) in enumerate(
            (
                ("ssim", "inversion SSIM (lower: more private)"),
                ("norm_auc", "norm-attack strength, max(AUC, 1-AUC) (0.5: chance)"),
            )
        ):
            ax = axes[row_index][col]
            for r in rows:
                if r[key] is None:
                    continue
                colour = "tab:blue" if r["cut"] == rows[0]["cut"] else "tab:orange"
                ax.scatter(r[key], r["test_accuracy"], marker=markers[r["defense"]], color=colour)
                ax.annotate(
                    f"{r['defense'].split('_')[0]} {r['strength']}".replace(" -", ""),
                    (r[key], r["test_accuracy"]),
                    fontsize=7,
                )
            ax.set_xlabel(label)
            ax.set_ylabel("test accuracy")
            cuts = list(dict.fromkeys(r["cut"] for r in rows))
            ax.set_title(f"{TITLES[name]} (blue: {cuts[0]}, orange: {cuts[-1]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        parts = [json.loads(p.read_text()) for p in args.from_json]
        result = parts[0]
        for part in parts[1:]:  # runs of one dataset or cut each, merged in order
            for name, data in part["datasets"].items():
                have = result["datasets"].setdefault(name, {"records": data["records"], "rows": []})
                if have is not data:
                    have["rows"] += data["rows"]
            result["seconds"] = max(result["seconds"], part["seconds"])
    else:
        for name in args.datasets:
            if not (args.data_dir / DATASETS[name]).is_file():
                say(f"bench_privacy_frontier: {args.data_dir / DATASETS[name]} is missing")
                return 2
        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        result = {
            "date": today(),
            "command": command_line("bench_privacy_frontier.py", argv),
            "train_steps": args.train_steps,
            "steps": args.steps,
            "limit": args.limit,
            "datasets": measure(args),
            "env": environment(),
            "seconds": time.perf_counter() - start,
        }
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
