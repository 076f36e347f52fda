"""Benchmark the privacy audit (issue 22, the measurements): how much each cut leaks.

Run from the repository root::

    .venv/bin/python bench/bench_privacy.py              # both datasets, a table each
    .venv/bin/python bench/bench_privacy.py --datasets breastmnist --json

For BreastMNIST and PneumoniaMNIST (``../shared/data``), ``small_cnn`` (the registry's
initial weights, seed 0) is trained as a one-hospital split job for ``--train-steps``
steps (Adam lr 0.002, batch 32) and then audited with :func:`medsplit.privacy.audit_cut`,
once per cut: an inverse network trained on the official train split's (image,
activation) pairs reconstructs the official val split (MONAI SSIM and PSNR, data range
1), and the distance correlation of val images and activations (the first 512). Then an
undefended binary U-shaped job (cuts ``pool1`` / ``pool``) scores the norm and cosine
label-leakage attacks on the gradients the hospital sent up at the second cut during its
training steps.

Published figures to compare with (other datasets, which cannot be downloaded here):
He et al. (ACSAC 2019) reach SSIM 0.99 from the first convolution on MNIST; the goal here
is above 0.9 right after ``conv1`` and a fall at deeper cuts. Li et al. (ICLR 2022)
recover binary labels with the norm attack at an AUC near 1.

Nothing here asserts on time; the figures are printed (``--json``: as one object).
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
from medsplit.models import build_model
from medsplit.privacy import AuditSettings, InversionSettings, audit_cut
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {
    "breastmnist": "breastmnist_28.npz",
    "pneumoniamnist": "pneumoniamnist_28_reconstructed.npz",
}
TITLES = {"breastmnist": "BreastMNIST", "pneumoniamnist": "PneumoniaMNIST"}
CUTS = ("conv1", "pool1", "pool2", "conv3", "pool")
USHAPED_CUTS = ("pool1", "pool")
#: He et al.'s SSIM at conv1 on MNIST, and this benchmark's goal for the first cut.
HE_SSIM, GOAL_SSIM = 0.99, 0.9


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--cuts", default=",".join(CUTS), help="small_cnn cuts, comma separated")
    parser.add_argument("--train-steps", type=int, default=100, help="split training first")
    parser.add_argument("--steps", type=int, default=400, help="the inverse network's steps")
    parser.add_argument("--limit", type=int, help="only the first N train and val records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def _config(cuts: tuple[str, ...], mode: str, seed: int) -> TrainingConfig:
    adam = OptimizerConfig(name="adam", lr=0.002)
    return TrainingConfig(
        cuts=cuts,
        mode=mode,
        client_optimizer=adam,
        server_optimizer=adam,
        batch_size=32,
        seed=seed,
    )


def _audit(
    train: DataSplit, val: DataSplit, cuts: tuple[str, ...], mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    begun = time.perf_counter()
    settings = AuditSettings(
        train_steps=args.train_steps,
        inversion=InversionSettings(steps=args.steps, seed=args.seed),
    )
    model = build_model("small_cnn", in_channels=1, num_classes=2, seed=args.seed)
    report = audit_cut(model, train, val, _config(cuts, mode, args.seed), settings)
    row = report.to_json()
    row["seconds"] = time.perf_counter() - begun
    return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.datasets:
        path = args.data_dir / DATASETS[name]
        train, val = load_medmnist(path, "train"), load_medmnist(path, "val")
        if args.limit:
            train = DataSplit(train.images[: args.limit], train.labels[: args.limit])
            val = DataSplit(val.images[: args.limit], val.labels[: args.limit])
        rows = []
        for cut in args.cuts.split(","):
            rows.append(_audit(train, val, (cut,), "vanilla", args))
            r = rows[-1]
            say(
                f"{name} {cut}: SSIM {r['ssim']:.3f}, PSNR {r['psnr']:.2f}, dcor "
                f"{r['distance_correlation']:.3f} ({r['seconds']:.0f} s)"
            )
        ushaped = _audit(train, val, USHAPED_CUTS, "ushaped", args)
        say(f"{name} U-shaped: {ushaped['label_leakage']} ({ushaped['seconds']:.0f} s)")
        out[name] = {
            "train_records": len(train),
            "val_records": len(val),
            "class_1_share": float(train.labels.float().mean()),
            "rows": rows,
            "ushaped": ushaped,
        }
    return out


def markdown(result: Mapping[str, Any]) -> str:
    date = result["date"]
    rows, leaks, notes = [], [], []
    for name, data in result["datasets"].items():
        title = TITLES.get(name, name)
        for r in data["rows"]:
            rows.append(
                [
                    date,
                    title,
                    r["cut"],
                    "×".join(map(str, r["activation"])),
                    f"**{r['ssim']:.3f}**",
                    f"{r['baseline_ssim']:.3f}",
                    f"{r['psnr']:.2f}",
                    f"{r['baseline_psnr']:.2f}",
                    f"{r['distance_correlation']:.3f}",
                ]
            )
        first = data["rows"][0]
        last = data["rows"][-1]
        notes.append(
            f"{title}: {data['train_records']:,} training images for the decoder, "
            f"{data['val_records']:,} reconstructed; after `{first['cut']}` SSIM "
            f"{first['ssim']:.3f} (goal {GOAL_SSIM}: "
            f"{'met' if first['ssim'] > GOAL_SSIM else 'missed'}; He et al. {HE_SSIM} on "
            f"MNIST, {first['ssim'] / HE_SSIM:.0%} of it), after `{last['cut']}` "
            f"{last['ssim']:.3f}."
        )
        u = data["ushaped"]
        leak = u["label_leakage"] or {}
        same = [r for r in data["rows"] if r["cut"] == u["cut"]]
        if same:
            # Exactness: the U-shaped job trains the same front, so its inversion is the same.
            equal = same[0]["ssim"] == u["ssim"] and same[0]["psnr"] == u["psnr"]
            notes.append(
                f"{title}: the U-shaped job's front at `{u['cut']}` inverts to SSIM "
                f"{u['ssim']:.3f}, {'exactly' if equal else 'NOT'} the vanilla job's."
            )

        def fig(key: str, leak: Mapping[str, Any] = leak) -> str:
            value = leak.get(key)
            return "n/a" if value is None else f"{value:.3f}"

        leaks.append(
            [
                date,
                title,
                " / ".join(u["cuts"]),
                f"{data['class_1_share']:.2f}",
                u["train_steps"],
                fig("norm_auc"),
                f"**{fig('norm_strength')}**",
                fig("cosine_auc"),
                f"**{fig('cosine_strength')}**",
            ]
        )
    inversion = table(
        [
            "date",
            "dataset",
            "cut",
            "activation",
            "SSIM",
            "mean image SSIM",
            "PSNR (dB)",
            "mean image PSNR",
            "distance correlation",
        ],
        rows,
    )
    leakage = table(
        [
            "date",
            "dataset",
            "U-shaped cuts",
            "class 1 share",
            "steps",
            "norm AUC",
            "norm strength",
            "cosine AUC",
            "cosine strength",
        ],
        leaks,
    )
    return (
        f"Inversion and distance correlation per cut (`small_cnn`, {result['train_steps']} "
        f"split-training steps first, decoder {result['steps']} steps):\n\n{inversion}\n\n"
        + "\n".join(f"- {n}" for n in notes)
        + f"\n\nLabel leakage of an undefended binary U-shaped job (the gradients the "
        f"hospital sent up at the second cut; strength = max(AUC, 1 − AUC), Li et al.: near "
        f"1):\n\n{leakage}\n\n`{result['command']}` ({result['seconds'] / 60:.1f} min, "
        f"{result['env']['threads']} thread)\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in args.datasets:
        path = args.data_dir / DATASETS[name]
        if not path.is_file():
            print(
                f"bench_privacy: {path} is missing; this benchmark needs the MedMNIST files "
                "in ../shared/data, or give --data-dir",
                file=sys.stderr,
            )
            return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    datasets = measure(args)
    result = {
        "date": today(),
        "command": command_line("bench_privacy.py", argv),
        "train_steps": args.train_steps,
        "steps": args.steps,
        "datasets": datasets,
        "env": environment(),
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
