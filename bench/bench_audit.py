"""Benchmark the audit log on PostgreSQL: append latency and the cost of the chain.

Run from the repository root, with PostgreSQL reachable::

    python bench/bench_audit.py            # a table
    python bench/bench_audit.py --json     # the same figures as JSON

DATABASE_URL names the server and a database name (default
``postgres://postgres@127.0.0.1:5432/medsplit_bench``). The benchmark never touches that
database: Django's test utilities create ``test_<name>`` next to it, migrate it, and drop
it at the end (dropping first a leftover of an interrupted run).

1. Append latency: ``audit_record`` (lock the chain head, hash, insert, move the head,
   commit), each append its own transaction, with 1 writer and with 8 writer threads
   (each its own connection); p50/p95/p99 and appends per second. Goal: p95 < 2 ms with
   one writer.
2. Baseline, side by side: a plain INSERT of the same columns into a copy of the table
   (same indexes, no triggers, no lock, no hash), one transaction each, through the
   same connections, interleaved with the appends in the same run.
3. Verification: ``audit_verify_chain`` over every row written, against streaming the
   same rows without checking them.

Nothing here asserts on time: the figures are printed, with their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as platform_module
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from report import table, today

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "platform"))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/medsplit_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")

import django  # noqa: E402

django.setup()

from django.db import connection, transaction  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from audit.models import AuditEvent  # noqa: E402
from audit.selectors import audit_verify_chain  # noqa: E402
from audit.services import audit_record  # noqa: E402
from kernel.actors import Actor, ActorKind  # noqa: E402

GOAL_P95_MS = 2.0
BLOCK = 100  # one writer: appends and plain inserts alternate in blocks of this many
ROUNDS = 2  # several writers: appends, then plain inserts, this many times
PLAIN = "bench_plain_insert"
ACTOR = Actor(ActorKind.SYSTEM, source_ip="10.0.0.1")
DETAILS = {"bytes_up": 1_048_576, "bytes_down": 1_048_576, "codec": "fp16", "step": 0}


def append(i: int) -> None:
    audit_record(
        actor=ACTOR,
        action="turn.step",
        target="job:1",
        hospital="st-marys",
        job_id=1,
        details={**DETAILS, "step": i},
    )


_plain_ids = iter(range(1, 10**9))
_plain_lock = threading.Lock()


def plain_insert(i: int) -> None:
    with _plain_lock:
        row_id = next(_plain_ids)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {PLAIN} (id, created_at, actor_kind, actor, action, target, hospital,"
            " job_id, details, source_ip, prev_hash, hash, mac_key_id, mac)"
            " VALUES (%s, %s, 'system', 'system', 'turn.step', 'job:1', 'st-marys', 1, %s,"
            " '10.0.0.1', %s, %s, 'k1', %s)",
            [
                row_id,
                timezone.now(),
                json.dumps({**DETAILS, "step": i}),
                secrets.token_hex(32),
                secrets.token_hex(32),
                secrets.token_hex(32),
            ],
        )


def timed(operation: Callable[[int], None], count: int, start: int = 0) -> list[float]:
    """Latencies in milliseconds of ``count`` calls of ``operation``."""
    latencies = []
    for i in range(start, start + count):
        began = time.perf_counter()
        operation(i)
        latencies.append((time.perf_counter() - began) * 1000)
    return latencies


def in_threads(operation: Callable[[int], None], threads: int, each: int) -> tuple[list, float]:
    """Run ``each`` calls in each of ``threads`` threads (own connections), started
    together; their latencies and the wall time of the whole."""
    barrier = threading.Barrier(threads + 1)
    results: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            barrier.wait()
            results[n] = timed(operation, each, start=n * each)
        except BaseException as e:
            errors.append(e)
        finally:
            connection.close()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    return [x for r in results for x in r], wall


def summary(case: str, latencies: list[float], wall_s: float) -> dict[str, object]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "case": case,
        "n": len(latencies),
        "p50_ms": round(cuts[49], 3),
        "p95_ms": round(cuts[94], 3),
        "p99_ms": round(cuts[98], 3),
        "per_s": round(len(latencies) / wall_s),
    }


def measure(appends: int, threads: int) -> dict[str, object]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {PLAIN} (LIKE {AuditEvent._meta.db_table} "
            "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        )
    timed(append, 50, start=0)  # warm up: connection, head row, caches
    timed(plain_insert, 50)

    one = {"audit_record": ([], 0.0), "plain INSERT": ([], 0.0)}
    for block in range(appends // BLOCK):
        for name, operation in (("audit_record", append), ("plain INSERT", plain_insert)):
            began = time.perf_counter()
            latencies = timed(operation, BLOCK, start=block * BLOCK)
            so_far, wall = one[name]
            one[name] = (so_far + latencies, wall + time.perf_counter() - began)

    many = {"audit_record": ([], 0.0), "plain INSERT": ([], 0.0)}
    each = appends // threads // ROUNDS
    for _ in range(ROUNDS):
        for name, operation in (("audit_record", append), ("plain INSERT", plain_insert)):
            latencies, wall = in_threads(operation, threads, each)
            so_far, total = many[name]
            many[name] = (so_far + latencies, total + wall)

    rows = AuditEvent.objects.count()
    began = time.perf_counter()
    result = audit_verify_chain()
    verify_s = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(f"the benchmark's own chain does not verify: {result.problem}")
    began = time.perf_counter()
    streamed = sum(
        1
        for _ in AuditEvent.objects.order_by("id")
        .values_list("hash", "details", "created_at")
        .iterator(chunk_size=2000)
    )
    stream_s = time.perf_counter() - began
    assert streamed == rows

    cases = [summary(f"1 writer, {name}", *one[name]) for name in one]
    cases += [summary(f"{threads} writers, {name}", *many[name]) for name in many]
    audit_1, plain_1, audit_n, plain_n = cases
    return {
        "append": cases,
        "ratios": {
            f"{label}: audit_record / plain INSERT": {
                key: round(audit[key] / plain[key], 2) for key in ("p50_ms", "p95_ms", "per_s")
            }
            for label, audit, plain in (
                ("1 writer", audit_1, plain_1),
                (f"{threads} writers", audit_n, plain_n),
            )
        },
        "verify": {
            "rows": rows,
            "verify_rows_per_s": round(rows / verify_s),
            "stream_rows_per_s": round(rows / stream_s),
            "ratio": round(verify_s / stream_s, 2),
        },
        "goal": {
            "single_writer_p95_ms": audit_1["p95_ms"],
            "goal_p95_ms": GOAL_P95_MS,
            "met": audit_1["p95_ms"] < GOAL_P95_MS,
        },
    }


def print_tables(figures: dict[str, object], env: dict[str, object]) -> None:
    print(f"audit append on {env['server']}; {env['cpus']} CPUs; Python {env['python']}")
    print(f"{'case':<30} {'n':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'per s':>8}")
    for row in figures["append"]:
        print(
            f"{row['case']:<30} {row['n']:>6} {row['p50_ms']:>8.3f} {row['p95_ms']:>8.3f} "
            f"{row['p99_ms']:>8.3f} {row['per_s']:>8}"
        )
    print()
    for label, ratio in figures["ratios"].items():
        print(
            f"{label}: p50 x{ratio['p50_ms']}, p95 x{ratio['p95_ms']}, throughput x{ratio['per_s']}"
        )
    verify = figures["verify"]
    print(
        f"verify: {verify['rows']} rows, {verify['verify_rows_per_s']} rows/s; streaming "
        f"them unchecked {verify['stream_rows_per_s']} rows/s (verify takes x{verify['ratio']})"
    )
    goal = figures["goal"]
    print(
        f"goal p95 < {goal['goal_p95_ms']} ms with one writer: "
        f"{'met' if goal['met'] else 'NOT met'} ({goal['single_writer_p95_ms']} ms)"
    )


def markdown(result: dict[str, object]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    cases = table(
        [f"case ({today()})", "p50 ms", "p95 ms", "p99 ms", "appends/s"],
        (
            [
                row["case"],
                f"{row['p50_ms']:.3f}",
                f"{row['p95_ms']:.3f}",
                f"{row['p99_ms']:.3f}",
                f"{row['per_s']:,}",
            ]
            for row in result["append"]  # type: ignore[union-attr]
        ),
    )
    ratios = "; ".join(
        f"{label.split(':')[0]}: p50 ×{r['p50_ms']}, p95 ×{r['p95_ms']}, throughput ×{r['per_s']}"
        for label, r in result["ratios"].items()  # type: ignore[union-attr]
    )
    goal, verify = result["goal"], result["verify"]
    verdict = "met" if goal["met"] else "**not met**"  # type: ignore[index]
    return (
        f"{cases}\n\nRatios of `audit_record` over plain INSERT: {ratios}. "
        f"**Goal p95 < {goal['goal_p95_ms']} ms with one writer: {verdict}** "  # type: ignore[index]
        f"({goal['single_writer_p95_ms']} ms). Verifying the chain read "  # type: ignore[index]
        f"{verify['verify_rows_per_s']:,} rows/s (×{verify['ratio']} the time of streaming "  # type: ignore[index]
        "the same rows unchecked)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--appends", type=int, default=2000, help="per case (default 2000)")
    parser.add_argument("--threads", type=int, default=8, help="concurrent writers (default 8)")
    args = parser.parse_args(argv)
    if connection.vendor != "postgresql":
        parser.error("DATABASE_URL must name a PostgreSQL server (postgres://...)")
    if args.appends < BLOCK or args.appends % BLOCK or args.appends % (ROUNDS * args.threads):
        parser.error(f"--appends must be a multiple of {BLOCK} and of {ROUNDS} x --threads")

    old_config = setup_databases(verbosity=0, interactive=False, serialized_aliases=set())
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            server = cursor.fetchone()[0].split(" on ")[0]
        figures = measure(args.appends, args.threads)
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)
    env = {"server": server, "cpus": os.cpu_count(), "python": platform_module.python_version()}
    if args.json:
        print(json.dumps({"env": env, **figures}, indent=2))
    else:
        print_tables(figures, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
