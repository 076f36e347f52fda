"""Benchmark the Redis relay: a frame's round trip through ``RedisChannel`` against SET + GET.

Run from the repository root, with a Redis server running::

    python bench/bench_relay.py                       # a table
    python bench/bench_relay.py --json                # the same figures as JSON
    python bench/bench_relay.py --url redis://host:6379/0 --repeats 15

For payloads of 64 KiB, 1 MiB and 16 MiB: ``send`` + ``receive`` of the payload through
a ``RedisChannel`` (default 4 MiB chunks, so 16 MiB crosses as four entries) against
plain redis-py ``SET`` + ``GET`` of the same bytes on the same server (the least a relay
through Redis must do: the bytes go in once and come out once). The two are measured
interleaved, in the same run; the figures are medians of the repetitions and their ratio
(goal: at most 1.2). Nothing here asserts on time.

With ``--resp`` (default: all three) each of redis-py's ways of speaking RESP is timed in
the same repetitions, round robin, channel and SET + GET alike (``report.RESP_VARIANTS``):
``pure Python`` (redis-py's own reply parser and packer: no hiredis), ``hiredis``
(hiredis' parser, redis-py's packer: the channel as it sets itself up) and ``hiredis + its
packer`` (what redis-py picks by itself with hiredis installed). Each ratio divides by the
SET + GET of the same variant.

The process keeps freed memory as agents and workers do (``medsplit.runtime``;
``MEDSPLIT_KEEP_FREED_MEMORY=0``: glibc's defaults, under which every copy of a large
payload maps fresh pages, and the copying variants pay for it twice).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import redis
from report import RESP_VARIANTS, table, today, use_resp

from medsplit.channel import RedisChannel
from medsplit.runtime import keep_freed_memory

SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "16 MiB": 16 << 20}


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


GOAL = 1.2


def bench(
    url: str, repeats: int, variants: tuple[str, ...] = RESP_VARIANTS
) -> list[dict[str, object]]:
    pairs = {}
    for variant in variants:
        channel, client = RedisChannel(url), redis.Redis.from_url(url)
        use_resp(channel._redis, variant)  # the channel's own client, for this bench only
        use_resp(client, variant)
        pairs[variant] = (channel, client)
    key = f"medsplit-bench:{uuid.uuid4()}"
    rows = []
    try:
        for label, size in SIZES.items():
            payload = os.urandom(size)
            relay: dict[str, list[float]] = {v: [] for v in variants}
            plain: dict[str, list[float]] = {v: [] for v in variants}
            for repetition in range(repeats + 1):  # the first warms every path up
                turn = repetition % len(variants)  # each variant in turn goes first
                for variant in variants[turn:] + variants[:turn]:
                    channel, client = pairs[variant]
                    stream = f"{key}:{variant}:stream"

                    def through_channel(
                        channel: RedisChannel = channel,
                        stream: str = stream,
                        payload: bytes = payload,
                    ) -> None:
                        channel.send(stream, payload)
                        if channel.receive(stream, timeout=30) != payload:
                            raise AssertionError("the channel changed the payload")

                    def set_get(client: redis.Redis = client, payload: bytes = payload) -> None:
                        client.set(key, payload)
                        if client.get(key) != payload:
                            raise AssertionError("SET + GET changed the payload")

                    r, p = timed(through_channel), timed(set_get)
                    if repetition:
                        relay[variant].append(r)
                        plain[variant].append(p)
            for variant in variants:
                r, p = statistics.median(relay[variant]), statistics.median(plain[variant])
                rows.append(
                    {
                        "payload": label,
                        "bytes": size,
                        "resp": variant,
                        "channel_ms": round(r * 1000, 3),
                        "set_get_ms": round(p * 1000, 3),
                        "ratio": round(r / p, 3),
                    }
                )
    finally:
        cleaner = redis.Redis.from_url(url)
        for variant in variants:
            stream = f"{key}:{variant}:stream"
            cleaner.delete(key, stream, stream + ":seq")
        cleaner.close()
        for channel, client in pairs.values():
            client.close()
            channel.close()
    return rows


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    return (
        table(
            [f"payload ({today()})", "RESP", "RedisChannel ms", "SET+GET ms", "ratio", "goal"],
            (
                [
                    row["payload"],
                    row["resp"],
                    f"{row['channel_ms']:.3f}",
                    f"{row['set_get_ms']:.3f}",
                    f"**{row['ratio']:.2f}**",
                    f"≤ {GOAL}" + ("" if row["ratio"] <= GOAL else ": **not met**"),
                ]
                for row in result["rows"]  # type: ignore[union-attr]
            ),
        )
        + f"\n\nMedians of {result['repeats']} interleaved round trips, every RESP variant in "
        "the same repetitions; each ratio against the SET+GET of its own variant; allocator: "
        f"{result.get('allocator', 'glibc defaults')}."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--resp",
        nargs="+",
        choices=RESP_VARIANTS,
        default=list(RESP_VARIANTS),
        help="the ways of speaking RESP to time side by side",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    allocator = keep_freed_memory()
    rows = bench(args.url, args.repeats, tuple(args.resp))
    if args.json:
        json.dump(
            {
                "url_scheme": args.url.split(":")[0],
                "repeats": args.repeats,
                "allocator": "freed memory kept" if allocator.applied else allocator.reason,
                "rows": rows,
            },
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    print(f"round trip, median of {args.repeats} (goal: ratio <= 1.2)")
    print(
        f"{'payload':>8}  {'RESP':>20}  {'RedisChannel ms':>15}  {'SET+GET ms':>10}  {'ratio':>6}"
    )
    for row in rows:
        print(
            f"{row['payload']:>8}  {row['resp']:>20}  {row['channel_ms']:>15.3f}  "
            f"{row['set_get_ms']:>10.3f}  "
            f"{row['ratio']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
