"""Benchmark record alignment by private set intersection against a plain set intersection.

Run from the repository root::

    python bench/bench_psi.py                          # 10^3 and 10^5 identifiers a party
    python bench/bench_psi.py --sizes 1000000          # 10^6 (tens of minutes when loaded)
    python bench/bench_psi.py --json                   # the same figures as JSON

For each size N, two parties of N identifiers each sharing 80 % of them, one
``medsplit.psi`` session (the real ``openmined-psi``, ECDH on P-256, one thread) with the
default ``raw`` setup: the client's request, the server's answer (response and setup),
the client's intersection, then the label party's K-way alignment (common order and
digest); against ``set(a) & set(b)`` on the same identifiers in one process. Each size
runs in a process of its own, so that its peak memory is its own: the PSI's as the growth
of the process' peak resident set (the library's C++ allocations included) over its
resident set before the session, the plain intersection's by ``tracemalloc``. Bytes are
each message's length as it would cross the relay. With ``--gcs`` the Golomb-compressed
setup's time and bytes are measured too.

Nothing here asserts on time: the figures are printed, as ratios against the plain set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from report import table, today

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from medsplit.psi import PsiClient, PsiServer, align  # noqa: E402
from medsplit.psi.session import DEFAULT_FALSE_POSITIVE_RATE  # noqa: E402

SESSION = "bench/psi/label>other"
SEED = 1
OVERLAP = 0.8
MIB = 1024 * 1024


def parties(size: int) -> tuple[list[str], list[str]]:
    """Two shuffled sets of ``size`` pseudonyms sharing :data:`OVERLAP` of them."""
    shared = int(size * OVERLAP)
    a = [f"P{i:08d}" for i in range(shared)] + [f"A{i:08d}" for i in range(size - shared)]
    b = [f"P{i:08d}" for i in range(shared)] + [f"B{i:08d}" for i in range(size - shared)]
    rng = random.Random(size)
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b


def rss_bytes() -> int:
    """This process' resident set now (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def plain(a: list[str], b: list[str], repeats: int) -> tuple[float, int, int]:
    """Median seconds of ``set(a) & set(b)``, its peak traced bytes, and its size."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        found = set(a) & set(b)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    found = set(a) & set(b)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak, len(found)


def measure_one(size: int, repeats: int, gcs: bool) -> dict[str, object]:
    """One size, in this process."""
    a, b = parties(size)
    # The plain intersection is cheap: always 7 runs, so one descheduling does not set it.
    plain_s, plain_peak, expected = plain(a, b, 7)
    before = rss_bytes()
    phases: dict[str, list[float]] = {"request": [], "answer": [], "intersect": [], "align": []}
    for _ in range(repeats):
        start = time.perf_counter()
        client = PsiClient(a, session=SESSION)
        request = client.request()
        phases["request"].append(time.perf_counter() - start)
        start = time.perf_counter()
        server = PsiServer(b, session=SESSION)
        reply = server.answer(request)
        phases["answer"].append(time.perf_counter() - start)
        start = time.perf_counter()
        found = client.intersect(reply)
        phases["intersect"].append(time.perf_counter() - start)
        start = time.perf_counter()
        alignment = align(a, [found], seed=SEED, minimum=1)
        alignment.digest()
        phases["align"].append(time.perf_counter() - start)
        if set(found) != set(a) & set(b) or len(alignment) != expected:
            raise SystemExit(f"PSI of {size:,} got {len(found):,} shared, expected {expected:,}")
    peak_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    med = {name: statistics.median(values) for name, values in phases.items()}
    psi_s = med["request"] + med["answer"] + med["intersect"]
    row: dict[str, object] = {
        "size": size,
        "shared": expected,
        "repeats": repeats,
        "plain_s": plain_s,
        "plain_peak_mib": plain_peak / MIB,
        **{f"{name}_s": value for name, value in med.items()},
        "psi_s": psi_s,
        "ratio": psi_s / plain_s,
        "psi_peak_growth_mib": max(peak_growth, 0) / MIB,
        "client_to_server_bytes": len(request),
        "server_to_client_bytes": len(reply.setup) + len(reply.response),
        "setup_bytes": len(reply.setup),
        "response_bytes": len(reply.response),
    }
    if gcs:
        # The default rate where the library's hash range fits, else twice the least that does.
        rate = max(DEFAULT_FALSE_POSITIVE_RATE, 2 * size * size / 2**63)
        start = time.perf_counter()
        compressed = PsiServer(
            b, session=SESSION, structure="gcs", false_positive_rate=rate
        ).answer(request)
        row["gcs_answer_s"] = time.perf_counter() - start
        row["gcs_setup_bytes"] = len(compressed.setup)
        row["gcs_rate"] = rate
        if set(client.intersect(compressed)) != set(found):
            raise SystemExit(f"gcs PSI of {size:,} differs from raw")
    return row


def measure(size: int, repeats: int, gcs: bool) -> dict[str, object]:
    """One size in a fresh process (its own peak memory)."""
    command = [sys.executable, __file__, "--one", str(size), "--repeats", str(repeats)]
    done = subprocess.run(
        [*command, *(["--gcs"] if gcs else [])], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"size {size:,} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f}" if value < 1e8 else f"{value / 1e6:.0f}"


def markdown(result: dict[str, object]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = result["rows"]  # type: ignore[index]
    times = table(
        [
            f"identifiers a party ({today()})",
            "shared",
            "PSI runs",
            "plain set ms",
            "PSI s",
            "ratio",
            "request s",
            "answer s",
            "intersect s",
            "align + digest s",
            "plain peak MiB",
            "PSI peak MiB",
        ],
        (
            [
                f"{row['size']:,}",
                f"{row['shared']:,}",
                row["repeats"],
                f"{row['plain_s'] * 1e3:.2f}",
                f"{row['psi_s']:.2f}",
                f"**{row['ratio']:,.0f}**",
                f"{row['request_s']:.2f}",
                f"{row['answer_s']:.2f}",
                f"{row['intersect_s']:.2f}",
                f"{row['align_s']:.2f}",
                f"{row['plain_peak_mib']:.1f}",
                f"{row['psi_peak_growth_mib']:.0f}",
            ]
            for row in rows  # type: ignore[union-attr]
        ),
    )
    traffic = table(
        [
            "identifiers a party",
            "client → server MB",
            "server → client MB (setup + response)",
            "bytes per identifier, each way",
            "gcs setup MB (false-positive rate)",
        ],
        (
            [
                f"{row['size']:,}",
                _mb(row["client_to_server_bytes"]),
                _mb(row["server_to_client_bytes"]),
                f"{row['client_to_server_bytes'] / row['size']:.1f} / "
                f"{row['server_to_client_bytes'] / row['size']:.1f}",
                f"{_mb(row['gcs_setup_bytes'])} ({row['gcs_rate']:.1g})"
                if "gcs_setup_bytes" in row
                else "not measured",
            ]
            for row in rows  # type: ignore[union-attr]
        ),
    )
    env = result["env"]  # type: ignore[index]
    return (
        f"openmined-psi {env['openmined_psi']}, one thread, {int(OVERLAP * 100)} % overlap, "
        "PSI: the median of its runs (one above 10^4 identifiers); plain set: medians of "
        f"7; on {env['cpus']} cores (load {env['load']}).\n\n"
        f"{times}\n\n{traffic}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--repeats", type=int, default=5, help="runs at sizes up to 10^4")
    parser.add_argument("--gcs", action="store_true", help="also measure the gcs setup")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the per-size child
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args.one, args.repeats, args.gcs)))
        return 0
    rows = [measure(n, args.repeats if n <= 10_000 else 1, args.gcs) for n in args.sizes]
    import private_set_intersection.python as psi

    result = {
        "env": {
            "python": sys.version.split()[0],
            "openmined_psi": psi.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load": f"{os.getloadavg()[0]:.1f}",
        },
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
