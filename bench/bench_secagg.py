"""Benchmark the cost of secure aggregation's masking against a plain sum.

Run from the repository root::

    python bench/bench_secagg.py            # a table
    python bench/bench_secagg.py --json     # the same figures as JSON

For K = 2, 3, 5 and 10 hospitals and a front of about 1M float32 parameters, one round of
``medsplit.secagg`` (core only, in one process, no relay) against a plain sum of the same
K tensors (``torch``, float32, in place), measured side by side, interleaved, medians:

* aggregator: parsing the K submissions' bytes, checking them, and their ring sum;
* mask: one hospital encoding its front and adding its K - 1 pairwise masks and its group
  mask (ChaCha20 expansion; every hospital does this in parallel);
* unmask: one hospital removing the K group masks and decoding the average;
* round: mask + aggregator + unmask, the critical path of a round when each hospital has
  its own machine; and the secrets a round seals (K(K-1)/2 pair seeds, K-1 group keys),
  sealing and opening all of them, once (key exchange, O(K²) in all).

Nothing here asserts on time: the figures are printed, as ratios against the plain sum.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from report import table, today

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from medsplit.secagg import (  # noqa: E402
    Aggregate,
    Aggregator,
    FixedPoint,
    RoundId,
    VectorLayout,
)
from tests.secagg_parties import exchange, hospital_rounds, make_keys  # noqa: E402

JOB = "bench-secagg"


def front(size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A front of ``size`` parameters: one large conv weight and a bias (a quarter of a
    small front, so that ``bench_splitfed`` can measure one of a few hundred values)."""
    bias = min(256, size // 4)
    return {
        "conv.weight": torch.randn(size - bias, generator=generator) * 0.1,
        "conv.bias": torch.randn(bias, generator=generator) * 0.1,
    }


def measure(k: int, size: int, repeats: int, keys: dict) -> dict[str, object]:
    names = sorted(keys)[:k]
    generator = torch.Generator().manual_seed(k)
    fronts = {h: front(size, generator) for h in names}
    flat = [torch.cat([t.reshape(-1) for t in f.values()]) for f in fronts.values()]
    layout = VectorLayout.of(fronts[names[0]])
    fixed = FixedPoint()
    samples: dict[str, list[float]] = {"plain": [], "aggregator": [], "mask": [], "unmask": []}
    exchange_s = 0.0
    for r in range(repeats):
        round_id = RoundId(JOB, r, 0, {h: 100 + 7 * i for i, h in enumerate(names)})
        rounds = hospital_rounds(round_id, keys, layout, fixed)
        start = time.perf_counter()
        exchange(rounds)
        exchange_s = time.perf_counter() - start if r == 0 else exchange_s

        start = time.perf_counter()  # the plain sum of the same tensors
        total = flat[0].clone()
        for tensor in flat[1:]:
            total += tensor
        samples["plain"].append(time.perf_counter() - start)

        start = time.perf_counter()
        first = rounds[names[0]].mask(fronts[names[0]])
        samples["mask"].append(time.perf_counter() - start)
        data = [first.to_bytes()] + [rounds[h].mask(fronts[h]).to_bytes() for h in names[1:]]

        start = time.perf_counter()
        aggregator = Aggregator(round_id, layout.length)
        for h, blob in zip(names, data, strict=True):
            aggregator.receive(blob, hospital=h)
        aggregate = aggregator.aggregate()
        samples["aggregator"].append(time.perf_counter() - start)

        aggregate = Aggregate.from_bytes(aggregate.to_bytes())
        start = time.perf_counter()
        rounds[names[0]].unmask(aggregate)
        samples["unmask"].append(time.perf_counter() - start)
    med = {name: statistics.median(values) for name, values in samples.items()}
    plain = med["plain"]
    return {
        "hospitals": k,
        "parameters": layout.length,
        "plain_ms": plain * 1e3,
        "aggregator_ms": med["aggregator"] * 1e3,
        "mask_ms": med["mask"] * 1e3,
        "unmask_ms": med["unmask"] * 1e3,
        "aggregator_ratio": med["aggregator"] / plain,
        "round_ratio": (med["mask"] + med["aggregator"] + med["unmask"]) / plain,
        "secrets_sealed": k * (k - 1) // 2 + k - 1,
        "exchange_ms": exchange_s * 1e3,
        "repeats": repeats,
    }


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = result["rows"]  # type: ignore[index]
    body = table(
        [
            f"K ({today()})",
            "plain sum ms",
            "aggregator ms",
            "ratio",
            "mask ms (1 hospital)",
            "unmask ms (1 hospital)",
            "round / plain",
            "secrets sealed",
            "seal + open all ms",
        ],
        (
            [
                row["hospitals"],
                f"{row['plain_ms']:.2f}",
                f"{row['aggregator_ms']:.2f}",
                f"**{row['aggregator_ratio']:.1f}**",
                f"{row['mask_ms']:.1f}",
                f"{row['unmask_ms']:.1f}",
                f"{row['round_ratio']:.1f}",
                row["secrets_sealed"],
                f"{row['exchange_ms']:.0f}",
            ]
            for row in rows  # type: ignore[union-attr]
        ),
    )
    size = rows[0]["parameters"]  # type: ignore[index]
    return (
        f"{size:,} parameters, medians of {rows[0]['repeats']} interleaved rounds "  # type: ignore[index]
        f"(torch {result['env']['threads']} thread).\n\n{body}"  # type: ignore[index]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--hospitals", type=int, nargs="+", default=[2, 3, 5, 10])
    parser.add_argument("--parameters", type=int, default=1 << 20, help="front size")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per K")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keys = make_keys(JOB, [f"hospital-{i:02d}" for i in range(max(args.hospitals))])
    rows = [measure(k, args.parameters, args.repeats, keys) for k in args.hospitals]
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if args.json:
        print(json.dumps({"env": env, "rows": rows}, indent=2))
    else:
        print(markdown({"env": env, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
