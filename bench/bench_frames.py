"""Benchmark the tensor wire format: framing overhead and codec throughput.

Run from the repository root::

    python bench/bench_frames.py            # a table
    python bench/bench_frames.py --json     # the same figures as JSON

1. Overhead: encoded frame bytes / raw tensor bytes with codec ``none`` (goal: at most
   1.01 for frames over 64 KiB), for single float32 tensors of several sizes and for a
   realistic frame: DenseNet121 activations after the first dense block for a batch of
   32 at 64x64, shape (32, 256, 16, 16) float32, plus int64 labels (32,).
2. Throughput: encode + decode of a frame against a plain copy of the same raw bytes,
   ``bytes(bytearray(raw))`` (two copies, the least a send plus a receive must do),
   measured side by side, interleaved, in the same run; medians of repetitions.

Nothing here asserts on time: the figures are printed, as ratios against the baseline.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
from report import table, today

from medsplit.wire import (
    CODECS,
    Frame,
    FrameKind,
    FrameMeta,
    decode_frame,
    encode_frame,
    raw_tensor_bytes,
)

KIB = 1024
MIB = 1024 * KIB
OVERHEAD_GOAL = 1.01


def make_frame(tensors: dict[str, torch.Tensor], codec: str = "none") -> Frame:
    meta = FrameMeta("bench-job", 3, 12, 4567, FrameKind.ACTIVATIONS, "vanilla", codec)
    return Frame(meta, tensors)


def workloads() -> dict[str, dict[str, torch.Tensor]]:
    """Named tensor sets: single float32 tensors of set sizes, and the DenseNet121 frame."""
    generator = torch.Generator().manual_seed(0)
    sets = {}
    for label, size in (("1 KiB", KIB), ("64 KiB", 64 * KIB), ("1 MiB", MIB), ("16 MiB", 16 * MIB)):
        sets[label] = {"features": torch.randn(size // 4, generator=generator)}
    sets["densenet121 b32 64px"] = {
        # ReLU output, as a cut after a dense block usually is: non-negative values.
        "features_denseblock1": torch.randn(32, 256, 16, 16, generator=generator).relu_(),
        "labels": torch.randint(0, 2, (32,), generator=generator),
    }
    return sets


def raw_bytes_of(tensors: dict[str, torch.Tensor]) -> bytes:
    return b"".join(t.contiguous().numpy().tobytes() for t in tensors.values())


def overhead(sets: dict[str, dict[str, torch.Tensor]]) -> list[dict[str, object]]:
    rows = []
    for label, tensors in sets.items():
        raw = raw_tensor_bytes(tensors)
        encoded = len(encode_frame(make_frame(tensors)))
        rows.append(
            {
                "workload": label,
                "raw_bytes": raw,
                "frame_bytes": encoded,
                "ratio": encoded / raw,
                "goal_applies": raw > 64 * KIB,
                "meets_goal": encoded / raw <= OVERHEAD_GOAL or raw <= 64 * KIB,
            }
        )
    return rows


def calibrate(fn: Callable[[], object], target_s: float) -> int:
    """How many calls make one timed sample last about ``target_s``."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(1000, round(target_s / once)))


def timed(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def throughput(
    sets: dict[str, dict[str, torch.Tensor]], repeats: int, target_s: float
) -> list[dict[str, object]]:
    rows = []
    for label, tensors in sets.items():
        raw = raw_bytes_of(tensors)

        def copy(raw: bytes = raw) -> bytes:
            return bytes(bytearray(raw))

        for codec in CODECS:
            frame = make_frame(tensors, codec)

            def round_trip(frame: Frame = frame) -> Frame:
                return decode_frame(encode_frame(frame))

            n_copy = calibrate(copy, target_s)
            n_codec = calibrate(round_trip, target_s)
            copy_s, codec_s = [], []
            for _ in range(repeats):
                # Interleaved, so drift in machine load hits both sides alike.
                copy_s.append(timed(copy, n_copy))
                codec_s.append(timed(round_trip, n_codec))
            copy_med, codec_med = statistics.median(copy_s), statistics.median(codec_s)
            rows.append(
                {
                    "workload": label,
                    "codec": codec,
                    "raw_bytes": len(raw),
                    "frame_bytes": len(encode_frame(frame)),
                    "copy_MBps": len(raw) / copy_med / 1e6,
                    "codec_MBps": len(raw) / codec_med / 1e6,
                    "time_ratio": codec_med / copy_med,
                    "repeats": repeats,
                }
            )
    return rows


def print_tables(over: list[dict[str, object]], through: list[dict[str, object]]) -> None:
    print("Framing overhead, codec none (goal <= 1.01 above 64 KiB)")
    print(f"{'workload':<22} {'raw bytes':>12} {'frame bytes':>12} {'ratio':>8}  goal")
    for row in over:
        goal = ("ok" if row["meets_goal"] else "MISSED") if row["goal_applies"] else "-"
        print(
            f"{row['workload']:<22} {row['raw_bytes']:>12} {row['frame_bytes']:>12} "
            f"{row['ratio']:>8.4f}  {goal}"
        )
    print()
    print("encode+decode vs bytes(bytearray(raw)), medians, interleaved in this run")
    print(
        f"{'workload':<22} {'codec':<6} {'wire/raw':>8} {'copy MB/s':>10} "
        f"{'codec MB/s':>11} {'time ratio':>11}"
    )
    for row in through:
        wire = row["frame_bytes"] / row["raw_bytes"]
        print(
            f"{row['workload']:<22} {row['codec']:<6} {wire:>8.3f} {row['copy_MBps']:>10.0f} "
            f"{row['codec_MBps']:>11.0f} {row['time_ratio']:>11.2f}"
        )


def markdown(result: dict[str, object]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    over = table(
        ["workload", "raw bytes", "frame bytes", "ratio", "goal (> 64 KiB)"],
        (
            [
                row["workload"],
                f"{row['raw_bytes']:,}",
                f"{row['frame_bytes']:,}",
                f"{row['ratio']:.4f}",
                (f"≤ {OVERHEAD_GOAL}: " + ("met" if row["meets_goal"] else "**not met**"))
                if row["goal_applies"]
                else "–",
            ]
            for row in result["overhead"]  # type: ignore[union-attr]
        ),
    )
    rows: dict[str, dict[str, float]] = {}
    for row in result["throughput"]:  # type: ignore[union-attr]
        rows.setdefault(row["workload"], {})[row["codec"]] = row["time_ratio"]
    through = table(
        ["workload", *CODECS],
        ([label, *(f"{codecs[c]:.2f}" for c in CODECS)] for label, codecs in rows.items()),
    )
    return (
        f"Measured {today()}.\n\n{over}\n\nencode + decode time over the copy's time:\n\n{through}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--repeats", type=int, default=7, help="timed samples per side")
    parser.add_argument("--sample-s", type=float, default=0.02, help="target length of a sample")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared machine, spinning OpenMP "
        "workers make timings swing tenfold)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    sets = workloads()
    over = overhead(sets)
    # The smallest set is only about framing; its throughput is header-bound noise.
    through = throughput(
        {k: v for k, v in sets.items() if k != "1 KiB"}, args.repeats, args.sample_s
    )
    if args.json:
        env = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.machine(),
            "repeats": args.repeats,
            "sample_s": args.sample_s,
        }
        print(json.dumps({"env": env, "overhead": over, "throughput": through}, indent=2))
    else:
        print_tables(over, through)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
