"""Benchmark: one in-memory split training step against one unsplit step.

Run from the repository root::

    python bench/bench_split_step.py              # DenseNet121, 1x64x64, batch 32 (goal <= 1.10)
    python bench/bench_split_step.py --json

The split step is the real path: the hospital's front, the frame encoded with codec
``none``, sent through an ``InMemoryChannel``, decoded against the server's expectations,
the back with the loss, the gradient frame back the same way, both optimizers stepping.
The unsplit step runs the same model whole with the same per-segment optimizers. The
two are timed interleaved, one of each per repetition, in the same process, and the
figure is the median of the per-repetition ratios: the machine's noise hits both alike.
Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time

import torch
from report import table, today

from medsplit.channel import InMemoryChannel, RelayKeys
from medsplit.cutting import split_model
from medsplit.models import build_model
from medsplit.modes import get_mode
from medsplit.protocol.link import LocalLink
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import StepIds

GOAL = 1.10


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    r = result
    return (
        table(
            [
                "date",
                "unsplit step (median)",
                "split step (median)",
                "split / unsplit (median, min–max)",
                "goal",
            ],
            [
                [
                    today(),
                    f"{r['unsplit_step_s_median'] * 1e3:.1f} ms",  # type: ignore[operator]
                    f"{r['split_step_s_median'] * 1e3:.1f} ms",  # type: ignore[operator]
                    f"**{r['ratio_median']:.3f}** ({r['ratio_min']:.3f}–{r['ratio_max']:.3f})",
                    f"≤ {r['goal']}",
                ]
            ],
        )
        + f"\n\n{r['wire_bytes_per_step']:,} bytes cross the cut per step."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--cut", default="features.denseblock1")
    parser.add_argument("--input-shape", default="1,64,64")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    shape = tuple(int(s) for s in args.input_shape.split(","))
    model = build_model(args.model, in_channels=shape[0], seed=0)
    config = OptimizerConfig(name="sgd", lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch_size, *shape, generator=gen)
    y = torch.randint(0, 2, (args.batch_size,), generator=gen)

    split = split_model(model, x[:2], args.cut)
    front = Party.create(split.front, config)
    back = Party.create(split.tail, config)
    vanilla = get_mode("vanilla")
    client = vanilla.client_role({"front": front}, split)
    server = vanilla.server_role(back, split, job="bench")
    link = LocalLink(InMemoryChannel(), RelayKeys().streams("bench", "h"))

    whole = copy.deepcopy(model)
    params = dict(whole.named_parameters())
    unsplit_parties = [
        Party.create(torch.nn.ParameterList([params[n] for n, _ in s.named_parameters()]), config)
        for s in split.segments
    ]
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0

    def timed(fn: object) -> float:
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        return time.perf_counter() - start

    def split_step() -> int:
        nonlocal step
        result = link.run_step(client, server, StepIds("bench", 0, 0, step), x, y)
        step += 1
        return result.bytes_up + result.bytes_down

    def unsplit_step() -> None:
        loss_fn(whole(x), y).backward()
        for party in unsplit_parties:
            party.step()

    for _ in range(args.warmup):
        split_step()
        unsplit_step()
    ratios, split_times, unsplit_times = [], [], []
    for repetition in range(args.repeats):
        # Alternate which goes first, so neither always runs on a warmer cache.
        if repetition % 2:
            unsplit_s = timed(unsplit_step)
            split_s = timed(split_step)
        else:
            split_s = timed(split_step)
            unsplit_s = timed(unsplit_step)
        split_times.append(split_s)
        unsplit_times.append(unsplit_s)
        ratios.append(split_s / unsplit_s)
    wire_bytes = split_step()

    result = {
        "model": args.model,
        "cut": args.cut,
        "input_shape": list(shape),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "split_step_s_median": statistics.median(split_times),
        "unsplit_step_s_median": statistics.median(unsplit_times),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "wire_bytes_per_step": wire_bytes,
        "goal": GOAL,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{args.model} cut after {args.cut}, input {args.input_shape}, "
            f"batch {args.batch_size}, {torch.get_num_threads()} torch threads, "
            f"{args.repeats} interleaved repetitions"
        )
        print(f"  unsplit step  median {result['unsplit_step_s_median'] * 1e3:8.1f} ms")
        print(f"  split step    median {result['split_step_s_median'] * 1e3:8.1f} ms")
        print(
            f"  split / unsplit: median {result['ratio_median']:.3f} "
            f"(min {result['ratio_min']:.3f}, max {result['ratio_max']:.3f}); goal <= {GOAL}"
        )
        print(f"  bytes on the wire per step: {wire_bytes:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
