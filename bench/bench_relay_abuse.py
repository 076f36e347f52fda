"""What a hostile hospital costs the relay and a worker, with the bounds and without.

Run from the repository root (needs Debian's ``redis-server``)::

    python bench/bench_relay_abuse.py            # tables
    python bench/bench_relay_abuse.py --json

Two measurements, each side by side in one run:

1. **An oversized frame.** A hospital announces a frame of ``--frame-mib`` MiB (270 by
   default) on its up stream. A reader process receives it once without bounds (as before
   the change: the whole frame is fetched and assembled) and once with the job's bounds
   (``RedisChannel(max_message_bytes=...)``, as the workers read now: refused from the first
   chunk). Reported: each reader's peak RSS above its own baseline, and Redis' memory.
2. **Junk on the relay.** On a relay started by ``deploy/redis-start.sh``, a hospital's real
   Redis user (the coordinator's rules) tries ``SET`` 4 × 32 MiB under its own prefix
   (refused by the rules), then ``XADD`` 8 × 8 MiB to its own stream and ``SET`` 4 × 32 MiB
   blobs "for" another hospital (both allowed by any ACL, as Redis cannot bound arguments).
   The workers' relay guard then measures it against a small_cnn job's bounds and the
   hospital is suspended. Reported: relay memory before, after the junk and after the
   suspension.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from report import table, today

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from hospitals.relay_acl import RedisAclUsers, relay_username  # noqa: E402
from medsplit.channel import RedisChannel, RelayKeys  # noqa: E402
from medsplit.training.config import TrainingConfig  # noqa: E402
from medsplit.training.relay_limits import relay_limits  # noqa: E402
from medsplit.training.setup import JobModel, cached_split  # noqa: E402
from workers.relay_guard import RelayGuard  # noqa: E402

MiB = 1 << 20
SMALL_CNN = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), 0)

# Peak RSS from VmHWM: ru_maxrss of an exec'd child starts at its parent's peak.
READER = """
import sys
from medsplit.channel import RedisChannel
from medsplit.errors import RelayAbuse

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

url, stream, bound = sys.argv[1], sys.argv[2], int(sys.argv[3])
before = hwm_kib()
channel = RedisChannel(url, max_message_bytes=bound or None)
try:
    payload = channel.receive(stream, timeout=60)
    outcome = f"received {len(payload)} bytes"
except RelayAbuse as e:
    outcome = "refused: " + str(e)[:60]
print((hwm_kib() - before) / 1024, outcome)
"""


class Relay:
    """A relay started as ``deploy/redis-start.sh`` starts it, in a folder of its own."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("bench_relay_abuse needs Debian's redis-server")
        self.password = secrets.token_urlsafe(32)
        self.port = _free_port()
        env = {
            **os.environ,
            "REDIS_PASSWORD": self.password,
            "REDIS_ACL_FILE": str(folder / "users.acl"),
            "REDIS_SERVER": binary,
            "REDIS_MAXMEMORY": "2gb",
        }
        self.process = subprocess.Popen(
            [
                *("sh", str(ROOT / "deploy" / "redis-start.sh"), "--port", str(self.port)),
                *("--bind", "127.0.0.1", "--dir", str(folder)),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self.admin_url = f"redis://default:{self.password}@127.0.0.1:{self.port}/0"
        for _ in range(200):
            try:
                self.admin().ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise SystemExit("the relay did not start")

    def admin(self) -> redis.Redis:
        return redis.Redis.from_url(self.admin_url, socket_timeout=30)

    def used_mib(self) -> float:
        return int(self.admin().info("memory")["used_memory"]) / MiB

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def oversized_frame(relay: Relay, frame_mib: int, bound: int) -> list[dict[str, object]]:
    keys = RelayKeys("bench-abuse")
    rows = []
    for label, limit in (("unbounded reader (before)", 0), ("bounded reader (now)", bound)):
        stream = keys.streams(f"job-{secrets.randbelow(10**6)}", "hostile").up
        sender = RedisChannel(relay.admin_url, socket_timeout=60)
        sender.send(stream, os.urandom(frame_mib * MiB))
        sender.close()
        redis_mib = relay.used_mib()
        out = subprocess.run(
            [sys.executable, "-c", READER, relay.admin_url, stream, str(limit)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.split(maxsplit=1)
        relay.admin().delete(stream, stream + ":seq")
        rows.append(
            {"reader": label, "rss_mib": float(out[0]), "outcome": out[1].strip(),
             "redis_mib_holding_it": redis_mib}
        )  # fmt: skip
    return rows


def junk(relay: Relay) -> dict[str, object]:
    prefix = "bench-abuse"
    keys = RelayKeys(prefix)
    settings.MEDSPLIT["RELAY_PREFIX"] = prefix
    provisioner = RedisAclUsers(relay.admin_url)
    password = secrets.token_urlsafe(32)
    slug = "hostile"
    provisioner.provision(
        username=relay_username(slug),
        password_sha256=hashlib.sha256(password.encode()).hexdigest(),
        slug=slug,
    )
    hostile = redis.Redis(
        port=relay.port, username=relay_username(slug), password=password, socket_timeout=60
    )
    baseline = relay.used_mib()
    refused = 0
    for i in range(4):
        try:
            hostile.set(f"{keys.hospital_prefix(slug)}junk-{i}", os.urandom(32 * MiB))
        except redis.exceptions.NoPermissionError:
            refused += 1
    stream = keys.streams("job-1", slug).up
    for _ in range(8):
        hostile.xadd(stream, {"d": os.urandom(8 * MiB)})
    for i in range(4):
        hostile.set(keys.mail("job-1", sender=slug, recipient=f"victim-{i}"), os.urandom(32 * MiB))
    stored = relay.used_mib()
    config = TrainingConfig(cuts=("pool1",), batch_size=32)
    limits = relay_limits(
        cached_split(JobModel("small_cnn", 2, 1, 2, (1, 28, 28), 0), config.cuts), config
    )
    guard = RelayGuard(relay.admin(), keys, lambda job, hospital: limits)
    overuse = guard.check(slug)
    found_s = time.perf_counter()
    deleted = provisioner.suspend(username=relay_username(slug), slug=slug)
    suspend_ms = 1000 * (time.perf_counter() - found_s)
    try:
        hostile.ping()
        locked_out = False
    except redis.RedisError:
        locked_out = True
    return {
        "baseline_mib": baseline,
        "after_junk_mib": stored,
        "after_suspension_mib": relay.used_mib(),
        "sets_refused_by_the_rules": refused,
        "caught": overuse is not None,
        "reason": overuse.reason() if overuse else "",
        "keys_deleted": deleted,
        "suspend_ms": suspend_ms,
        "locked_out": locked_out,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(result: dict[str, object]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    frames = table(
        [f"reader of a {result['frame_mib']} MiB frame ({today()})", "peak RSS above baseline",
         "Redis holding the frame", "outcome"],
        (
            [r["reader"], f"{r['rss_mib']:.0f} MiB", f"{r['redis_mib_holding_it']:.0f} MiB",
             r["outcome"][:40]]
            for r in result["frames"]  # type: ignore[union-attr]
        ),
    )  # fmt: skip
    j = result["junk"]
    junk_table = table(
        ["relay memory", "MiB"],
        [
            ["before", f"{j['baseline_mib']:.1f}"],  # type: ignore[index]
            ["after the junk (8 × 8 MiB XADD, 4 × 32 MiB blobs)", f"{j['after_junk_mib']:.1f}"],  # type: ignore[index]
            ["after the suspension", f"{j['after_suspension_mib']:.1f}"],  # type: ignore[index]
        ],
    )
    return (
        frames
        + "\n\n"
        + junk_table
        + f"\n\n`SET` under its own prefix refused by the rules: {j['sets_refused_by_the_rules']}"  # type: ignore[index]
        + f" of 4; caught by the guard: {j['caught']}; suspended in {j['suspend_ms']:.0f} ms, "  # type: ignore[index]
        + f"{j['keys_deleted']} keys deleted, the user locked out: {j['locked_out']}."  # type: ignore[index]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frame-mib", type=int, default=270)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = TrainingConfig(cuts=("pool1",), batch_size=32)
    split = cached_split(SMALL_CNN, config.cuts)
    bound = relay_limits(split, config).frame_bytes
    with tempfile.TemporaryDirectory(prefix="medsplit-bench-abuse-") as folder:
        relay = Relay(Path(folder))
        try:
            result = {
                "frame_mib": args.frame_mib,
                "bound_bytes": bound,
                "frames": oversized_frame(relay, args.frame_mib, bound),
                "junk": junk(relay),
            }
        finally:
            relay.stop()
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
