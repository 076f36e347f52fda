"""Benchmark the hospital's hijacking detectors (SplitOut, SplitGuard) against hijacking.

Run from the repository root::

    python bench/bench_hijack.py                # a table
    python bench/bench_hijack.py --json         # the same figures as JSON
    python bench/bench_hijack.py --runs 3 --epochs 3 --undetected-epochs 12
    python bench/bench_hijack.py --method splitguard --probe-probability 0.3 --epochs 2

Each seed runs a vanilla BreastMNIST job (small_cnn cut after ``pool1``; one hospital,
its training split; Adam at 1e-3 on both sides) in process: the hospital's real
:class:`~medsplit.turns.TurnClient` against a real :class:`~medsplit.turns.TurnServer`
over the in-process channel (the same frames as over Redis). Three runs per seed:

1. honest: the job's own server, the detector on (a flag is a false positive);
2. hijacked: the test harness's feature-space hijacker (``tests/hijack_server.py``,
   Pasquini et al., CCS 2021; its auxiliary data is BreastMNIST's test split), the
   detector on; the steps until it stops the hospital, and the hijacker's
   reconstruction SSIM of the hospital's first 64 training images at that moment;
3. the baseline, side by side: the same hijacker with the detector off, for
   ``--undetected-epochs``; the SSIM it reaches.

Without ``/work/shared/data/breastmnist_28.npz`` (or ``--data``) the images are
synthetic. Nothing here asserts; the figures are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
from report import command_line, environment, table, today  # noqa: E402

from medsplit.channel import InMemoryChannel, RelayKeys  # noqa: E402
from medsplit.cutting import split_model  # noqa: E402
from medsplit.data import DataSplit, load_medmnist, synthetic_split  # noqa: E402
from medsplit.defenses import HijackDetection, PrivacyOptions  # noqa: E402
from medsplit.models import build_model  # noqa: E402
from medsplit.privacy.inversion import image_quality  # noqa: E402
from medsplit.protocol.optim import OptimizerConfig  # noqa: E402
from medsplit.training.config import TrainingConfig  # noqa: E402
from tests.hijack_server import FeatureSpaceHijacker, HijackRun, run_turn  # noqa: E402

DATA = Path("/work/shared/data/breastmnist_28.npz")
CUT = "pool1"
PROBE = 64  # the hospital images the hijacker's reconstructions are scored on


def _data(path: Path | None, seed: int) -> tuple[DataSplit, DataSplit, str]:
    if path is not None and path.exists():
        return load_medmnist(path, "train"), load_medmnist(path, "test"), path.name
    return synthetic_split(546, seed=seed), synthetic_split(156, seed=seed + 1), "synthetic"


def _config(
    seed: int, epochs: int, *, detect: bool, detector: HijackDetection | None = None
) -> TrainingConfig:
    adam = OptimizerConfig(name="adam", lr=1e-3)
    detector = detector or HijackDetection()
    privacy = PrivacyOptions(hijack_detection=detector) if detect else PrivacyOptions()
    return TrainingConfig(
        cuts=(CUT,),
        mode="vanilla",
        client_optimizer=adam,
        server_optimizer=adam,
        batch_size=32,
        local_epochs=epochs,
        seed=seed,
        job=f"hijack-{seed}-{int(detect)}",
        privacy=privacy,
    )


def _ssim(run: HijackRun, attacker: FeatureSpaceHijacker, train: DataSplit) -> float:
    images = train.images[:PROBE]
    with torch.no_grad():
        features = run.client.parties["front"].module(images)[attacker.name]
    return image_quality(images, attacker.reconstruct(features).clamp(0, 1))[0]


def one_seed(
    seed: int,
    train: DataSplit,
    aux: DataSplit,
    epochs: int,
    undetected: int,
    detector: HijackDetection | None = None,
) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = build_model("small_cnn", spatial_dims=2, in_channels=1, num_classes=2, seed=seed)
    split = split_model(model, train.images[:2], (CUT,))
    keys = RelayKeys(prefix=f"bench-hijack-{seed}")
    out: dict[str, Any] = {"seed": seed}

    def turn(config: TrainingConfig, attacker: FeatureSpaceHijacker | None) -> HijackRun:
        streams = keys.streams(config.job, "h0")
        return run_turn(
            channel=InMemoryChannel(),
            streams=streams,
            split=split,
            config=config,
            train=train,
            attacker=attacker,
        )

    began = time.monotonic()
    honest = turn(_config(seed, epochs, detect=True, detector=detector), None)
    out["honest_flagged"] = honest.detected is not None
    out["honest_steps"] = honest.client.train_steps
    out["honest_seconds"] = time.monotonic() - began
    steps_per_epoch = honest.client.train_steps // epochs

    def hijacker() -> FeatureSpaceHijacker:
        return FeatureSpaceHijacker(
            boundary=split.boundaries[0], aux=aux.images, seed=seed, lr=1e-3
        )

    began = time.monotonic()
    attacker = hijacker()
    caught = turn(_config(seed, epochs, detect=True, detector=detector), attacker)
    out["hijack_flagged"] = caught.detected is not None
    out["detected_at_step"] = caught.detected.step if caught.detected else None
    out["applied_before_detection"] = len(caught.applied)
    out["ssim_at_detection"] = _ssim(caught, attacker, train)
    out["hijack_seconds"] = time.monotonic() - began

    began = time.monotonic()
    attacker = hijacker()
    free = turn(_config(seed, undetected, detect=False), attacker)
    out["undetected_steps"] = len(free.applied)
    out["ssim_undetected"] = _ssim(free, attacker, train)
    out["undetected_seconds"] = time.monotonic() - began
    out["steps_per_epoch"] = steps_per_epoch
    return out


def summary(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    detected = [r["detected_at_step"] for r in rows if r["detected_at_step"] is not None]
    return {
        "tpr": sum(r["hijack_flagged"] for r in rows) / len(rows),
        "fpr": sum(r["honest_flagged"] for r in rows) / len(rows),
        "detected_step_median": statistics.median(detected) if detected else None,
        "detected_step_max": max(detected) if detected else None,
        "within_first_epoch": all(
            r["detected_at_step"] is not None and r["detected_at_step"] < r["steps_per_epoch"]
            for r in rows
        ),
        "ssim_at_detection_mean": statistics.mean(r["ssim_at_detection"] for r in rows),
        "ssim_undetected_mean": statistics.mean(r["ssim_undetected"] for r in rows),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="seeds (honest + hijacked each)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of the detected runs")
    parser.add_argument("--undetected-epochs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--method", choices=("splitout", "splitguard"), default="splitout")
    parser.add_argument("--probe-probability", type=float, default=0.1, help="splitguard's")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, aux, source = _data(args.data, 0)
    defaults = HijackDetection(method=args.method, probe_probability=args.probe_probability)
    rows = [
        one_seed(s, train, aux, args.epochs, args.undetected_epochs, defaults)
        for s in range(args.runs)
    ]
    return {
        "command": command_line("bench_hijack.py", argv),
        "date": today(),
        "environment": environment(),
        "data": source,
        "link": "in process (InMemoryChannel; the frames of the Redis relay)",
        "detector": replace(defaults).to_json(),
        "runs": rows,
        "summary": summary(rows),
    }


def _applied(method: str) -> str:
    """What "detected at step N" means for the hospital's front."""
    if method == "splitguard":
        return (
            "detected at step 13 means the 13 steps before it were sent and the regular ones "
            "among them applied (a fake batch's step never is), the 14th gradient frame refused."
        )
    return "detected at step 2 means two steps applied, the third gradient frame refused."


def markdown(result: Mapping[str, Any]) -> str:
    s = result["summary"]
    head = (
        f"Measured {result['date']} with `{result['command']}` on {result['data']}, "
        f"{result['link']}; detector settings {json.dumps(result['detector'])}. "
        f"Each honest run {result['runs'][0]['honest_steps']} steps "
        f"({result['runs'][0]['steps_per_epoch']} a epoch), no step of it flagged for a true "
        f"negative; a step number is 0-based: {_applied(result['detector']['method'])}\n\n"
    )
    totals = table(
        [
            "runs (honest + hijacked)",
            "TPR",
            "FPR",
            "detected at step (median / max)",
            "within the first epoch",
            "hijacker's SSIM at detection",
            "hijacker's SSIM undetected (baseline)",
        ],
        [
            [
                f"{len(result['runs'])} + {len(result['runs'])}",
                f"{s['tpr']:.2f}",
                f"{s['fpr']:.2f}",
                f"{s['detected_step_median']} / {s['detected_step_max']}",
                "yes" if s["within_first_epoch"] else "no",
                f"{s['ssim_at_detection_mean']:.3f}",
                f"{s['ssim_undetected_mean']:.3f}",
            ]
        ],
    )
    per_seed = table(
        [
            "seed",
            "honest flagged",
            "hijack detected at step",
            "SSIM at detection",
            "undetected steps",
            "SSIM undetected",
        ],
        [
            [
                r["seed"],
                "yes" if r["honest_flagged"] else "no",
                r["detected_at_step"],
                f"{r['ssim_at_detection']:.3f}",
                r["undetected_steps"],
                f"{r['ssim_undetected']:.3f}",
            ]
            for r in result["runs"]
        ],
    )
    return head + totals + "\n\n" + per_seed + "\n"


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=2) if "--json" in sys.argv else markdown(result))
