"""Benchmark the relay on one Redis against a three-node Redis Cluster: bytes per second,
Redis CPU per byte, and memory per stream, per node.

Run from the repository root (``redis-server`` on the PATH; it starts its own servers on
free loopback ports in a temporary folder and stops them)::

    python bench/bench_cluster.py            # a table
    python bench/bench_cluster.py --json     # the same figures as JSON

For each relay (one ``redis-server``, then three in cluster mode) and each frame size,
``--procs`` client processes each drive ``--streams`` stream pairs of their own jobs (the
keys ``RelayKeys`` names, so on the cluster the jobs spread over the nodes by hash tag)
for ``--seconds``: a frame up, read back, a frame down, read back, round robin, through
``RedisChannel``. Reported: the frame bytes moved per second (each frame counted once),
the Redis CPU seconds that took on each node (``INFO cpu``), hence the bytes one node moves
per second of its own CPU (what sizes a node, since the clients here share the machine's
cores with Redis), and the memory a stream pair keeps once its frames are read
(``INFO memory`` over 2,000 pairs). Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
from report import table, today

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medsplit.channel import RedisChannel, RelayKeys  # noqa: E402
from medsplit.channel.connect import connect, every_node  # noqa: E402
from tests.redis_cluster import LocalCluster, _free_cluster_port  # noqa: E402

SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20}
IDLE_PAIRS = 2000


def _drive(url: str, prefix: str, worker: int, streams: int, size: int, seconds: float, out):
    """One client process: round robin over its stream pairs until the time is up."""
    keys = RelayKeys(prefix)
    channel = RedisChannel(url)
    payload = os.urandom(size)
    pairs = [keys.streams(f"job-{worker}x{n}", "h") for n in range(streams)]
    moved = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for pair in pairs:
                for stream in (pair.up, pair.down):
                    channel.send(stream, payload)
                    if len(channel.receive(stream, timeout=30)) != size:
                        raise AssertionError("a frame changed on the relay")
                    moved += size
        for pair in pairs:
            channel.reset(pair.up)
            channel.reset(pair.down)
    finally:
        channel.close()
    out.put(moved)


def _cpu(nodes: list[redis.Redis]) -> list[float]:
    return [
        float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in (n.info("cpu") for n in nodes)
    ]


def _used_memory(nodes: list[redis.Redis]) -> int:
    return sum(int(n.info("memory")["used_memory"]) for n in nodes)


def measure(url: str, *, procs: int, streams: int, seconds: float) -> dict[str, object]:
    admin = connect(url)
    nodes = every_node(admin)
    rows = []
    try:
        for label, size in SIZES.items():
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            queue: multiprocessing.Queue = multiprocessing.Queue()
            before, start = _cpu(nodes), time.perf_counter()
            workers = [
                multiprocessing.Process(
                    target=_drive, args=(url, prefix, w, streams, size, seconds, queue)
                )
                for w in range(procs)
            ]
            for w in workers:
                w.start()
            moved = sum(queue.get(timeout=seconds + 120) for _ in workers)
            for w in workers:
                w.join()
            wall = time.perf_counter() - start
            cpu = [b - a for a, b in zip(before, _cpu(nodes), strict=True)]
            rows.append(
                {
                    "frame": label,
                    "streams": procs * streams * 2,
                    "mb_per_s": round(moved / wall / 1e6, 1),
                    "redis_cpu_per_s": [round(c / wall, 2) for c in cpu],
                    "mb_per_node_cpu_s": round(moved / max(sum(cpu), 1e-9) / 1e6, 1),
                }
            )
        # What an idle stream pair keeps once its frames are read (its counters, the
        # emptied stream), over many jobs.
        keys = RelayKeys(f"bench-{uuid.uuid4().hex[:8]}")
        channel = RedisChannel(url)
        base = _used_memory(nodes)
        pairs = [keys.streams(f"job-idle{n}", "h") for n in range(IDLE_PAIRS)]
        for pair in pairs:
            for stream in (pair.up, pair.down):
                channel.send(stream, b"x" * 300)
                channel.receive(stream, timeout=5)
        per_pair = (_used_memory(nodes) - base) / IDLE_PAIRS
        keys_per_node = [n.dbsize() for n in nodes]
        for pair in pairs:
            channel.reset(pair.up)
            channel.reset(pair.down)
        channel.close()
    finally:
        admin.close()
    return {
        "nodes": len(nodes),
        "rows": rows,
        "idle_pair_bytes": round(per_pair),
        "idle_keys_per_node": keys_per_node,
    }


def _single(folder: Path) -> tuple[subprocess.Popen, str]:
    port = _free_cluster_port()
    process = subprocess.Popen(
        [
            *(shutil.which("redis-server") or "redis-server", "--port", str(port)),
            *("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            if redis.Redis.from_url(url).ping():
                break
        except redis.RedisError:
            time.sleep(0.05)
    return process, url


def bench(*, procs: int, streams: int, seconds: float) -> dict[str, object]:
    result: dict[str, object] = {
        "cores": os.cpu_count(),
        "procs": procs,
        "seconds": seconds,
    }
    with tempfile.TemporaryDirectory(prefix="medsplit-bench-cluster-") as folder:
        process, url = _single(Path(folder))
        try:
            result["single"] = measure(url, procs=procs, streams=streams, seconds=seconds)
        finally:
            process.terminate()
            process.wait(10)
        (Path(folder) / "cluster").mkdir()
        cluster = LocalCluster(Path(folder) / "cluster")
        try:
            cluster.start()
            result["cluster"] = measure(
                cluster.url(), procs=procs, streams=streams, seconds=seconds
            )
        finally:
            cluster.stop()
    return result


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/deploy.md`` / ``docs/benchmarks.md``."""
    lines = []
    for name in ("single", "cluster"):
        run = result[name]
        for row in run["rows"]:  # type: ignore[index]
            lines.append(
                [
                    f"{name} ({run['nodes']} node{'s' if run['nodes'] > 1 else ''})",  # type: ignore[index]
                    row["frame"],
                    str(row["streams"]),
                    f"{row['mb_per_s']:.1f}",
                    " / ".join(f"{c:.2f}" for c in row["redis_cpu_per_s"]),
                    f"{row['mb_per_node_cpu_s']:.1f}",
                    f"{run['idle_pair_bytes']:,}",  # type: ignore[index]
                ]
            )
    return (
        table(
            [
                f"relay ({today()})",
                "frame",
                "streams",
                "MB/s moved",
                "Redis CPU s/s per node",
                "MB per Redis CPU s",
                "bytes per idle stream pair",
            ],
            lines,
        )
        + f"\n\n{result['procs']} client processes, {result['seconds']} s per size, on "
        f"{result['cores']} cores shared by the clients and every Redis node. Keys of "
        f"{IDLE_PAIRS:,} idle jobs (a stream pair each) per node: "
        + "; ".join(
            f"{name} " + " / ".join(str(n) for n in result[name]["idle_keys_per_node"])  # type: ignore[index]
            for name in ("single", "cluster")
        )
        + "."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8, help="stream pairs per process")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = bench(procs=args.procs, streams=args.streams, seconds=args.seconds)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
