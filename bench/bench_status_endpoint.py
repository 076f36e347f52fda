"""Benchmark: the job status endpoint with a small and a large audit log, side by side.

Run from the repository root (needs the PostgreSQL at --postgres; makes and drops its
own databases, never touching others)::

    .venv/bin/python bench/bench_status_endpoint.py            # a table
    .venv/bin/python bench/bench_status_endpoint.py --json

Two coordinators run at once under gunicorn on loopback, each on its own PostgreSQL
database holding the same consortium and running job; one database has 10^3 audit
rows, the other 10^5. Eight client threads request ``GET /api/jobs/{id}/status/`` as a
signed-in consortium admin, against each server in turn, alternating, several times;
the figures are requests per second and latency percentiles, and the ratios between
the two logs. Goal: the large log costs at most 1.2 times the small one. Requests are
bounded in count; nothing leaves 127.0.0.1. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from report import table, today

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = ROOT / "platform"
GOAL = 1.2


def markdown(result: dict) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = table(
        [f"audit rows ({today()})", "req/s", "p50 ms", "p95 ms", "errors"],
        (
            [
                f"{int(size):,}",
                f"{f['rps_median']:.1f}",
                f"{f['p50_ms_median']:.2f}",
                f"{f['p95_ms_median']:.2f}",
                f["errors"],
            ]
            for size, f in result["audit_rows"].items()
        ),
    )
    return (
        f"{rows}\n\nreq/s small / large: **{result['rps_ratio_small_over_large']:.3f}**; "
        f"p95 large / small: **{result['p95_ratio_large_over_small']:.3f}** "
        f"(goal ≤ {result['goal']}). {result['clients']} clients, "
        f"{result['requests_per_client_per_run']} requests each per run, {result['runs']} "
        f"alternating runs, {result['gunicorn_workers']} gunicorn workers per server."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--sizes", type=int, nargs=2, default=[1_000, 100_000])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=250, help="per client, per run")
    parser.add_argument("--runs", type=int, default=4, help="alternating runs per server")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per server")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", help=argparse.SUPPRESS)  # internal: seed one database
    args = parser.parse_args(argv)
    if args.seed:
        return _seed(int(args.seed))

    servers = []
    try:
        for size in args.sizes:
            url = f"{args.postgres}/medsplit_bench_status_{size}"
            _recreate_database(args.postgres, f"medsplit_bench_status_{size}")
            env = {**os.environ, "DATABASE_URL": url, "MEDSPLIT_LOG_LEVEL": "WARNING"}
            print(f"seeding {size:,} audit rows ...", file=sys.stderr, flush=True)
            seeded = subprocess.run(
                [sys.executable, __file__, "--seed", str(size)],
                env=env,
                capture_output=True,
                text=True,
            )
            if seeded.returncode != 0:
                raise RuntimeError(f"seeding failed:\n{seeded.stderr[-3000:]}")
            info = json.loads(seeded.stdout.strip().splitlines()[-1])
            port = _free_port()
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "coordinator.wsgi",
                    "--chdir",
                    str(PLATFORM),
                    "-b",
                    f"127.0.0.1:{port}",
                    "-w",
                    str(args.workers),
                    "--log-level",
                    "warning",
                ],
                env=env,
            )
            servers.append({"size": size, "port": port, "process": process, **info})
        for server in servers:
            _wait_for(server["port"])

        results: dict[int, list[dict[str, float]]] = {s["size"]: [] for s in servers}
        for run in range(args.runs):
            order = servers if run % 2 == 0 else list(reversed(servers))
            for server in order:
                results[server["size"]].append(_load(server, args.clients, args.requests))
    finally:
        for server in servers:
            server["process"].terminate()
            server["process"].wait(timeout=30)
        for size in args.sizes:
            _drop_database(args.postgres, f"medsplit_bench_status_{size}")

    summary = _summarise(results, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0


def _load(server: dict, clients: int, requests: int) -> dict[str, float]:
    """``clients`` threads, ``requests`` each, one connection per request."""
    path = f"/api/jobs/{server['job_id']}/status/"
    headers = {"Cookie": f"sessionid={server['session']}", "Accept": "application/json"}
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def client() -> None:
        nonlocal errors
        mine, bad = [], 0
        for _ in range(requests):
            start = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=30)
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            conn.close()
            mine.append(time.perf_counter() - start)
            bad += response.status != 200
        with lock:
            latencies.extend(mine)
            errors += bad

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "rps": len(latencies) / wall,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p95_ms": 1e3 * latencies[int(len(latencies) * 0.95)],
        "errors": errors,
    }


def _summarise(results: dict[int, list[dict[str, float]]], args: argparse.Namespace) -> dict:
    small, large = args.sizes
    per = {
        size: {
            "rps_median": statistics.median(r["rps"] for r in runs),
            "p50_ms_median": statistics.median(r["p50_ms"] for r in runs),
            "p95_ms_median": statistics.median(r["p95_ms"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
            "runs": runs,
        }
        for size, runs in results.items()
    }
    return {
        "clients": args.clients,
        "requests_per_client_per_run": args.requests,
        "runs": args.runs,
        "gunicorn_workers": args.workers,
        "audit_rows": per,
        "rps_ratio_small_over_large": per[small]["rps_median"] / per[large]["rps_median"],
        "p95_ratio_large_over_small": per[large]["p95_ms_median"] / per[small]["p95_ms_median"],
        "goal": GOAL,
    }


def _print(summary: dict) -> None:
    print(
        f"GET /api/jobs/{{id}}/status/, {summary['clients']} clients, "
        f"{summary['gunicorn_workers']} gunicorn workers, {summary['runs']} alternating runs"
    )
    print(f"{'audit rows':>12} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'errors':>7}")
    for size, figures in summary["audit_rows"].items():
        print(
            f"{size:>12,} {figures['rps_median']:>8.1f} {figures['p50_ms_median']:>8.2f} "
            f"{figures['p95_ms_median']:>8.2f} {figures['errors']:>7}"
        )
    print(
        f"req/s small/large: {summary['rps_ratio_small_over_large']:.3f}; "
        f"p95 large/small: {summary['p95_ratio_large_over_small']:.3f} (goal <= {GOAL})"
    )


def _admin_connection(postgres: str):
    import psycopg

    return psycopg.connect(f"{postgres}/postgres", autocommit=True)


def _recreate_database(postgres: str, name: str) -> None:
    with _admin_connection(postgres) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop_database(postgres: str, name: str) -> None:
    with _admin_connection(postgres) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the coordinator on port {port} did not start within {timeout} s")


def _seed(audit_rows: int) -> int:
    """In a fresh database: migrate, make a consortium with a running job, fill the log."""
    sys.path.insert(0, str(PLATFORM))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from accounts.models import Membership
    from audit.chain import content_hash
    from audit.models import AuditChainHead, AuditEvent
    from audit.selectors import audit_verify_chain
    from hospitals.models import Hospital
    from kernel.actors import Actor, ActorKind, Role
    from training import services

    call_command("migrate", verbosity=0)
    admin = get_user_model().objects.create_user("bench-admin", password="bench-password-123")
    Membership.objects.create(user=admin, role=Role.CONSORTIUM_ADMIN.value)
    actor = Actor(ActorKind.PERSON, user=admin, role=Role.CONSORTIUM_ADMIN)
    summary = {
        "image_shape": [1, 28, 28],
        "label_counts": {"0": 50, "1": 50},
        "split_sizes": {"train": 80, "val": 20},
    }
    hospitals = [
        Hospital.objects.create(
            name=f"Hospital {i}",
            slug=f"hospital-{i}",
            status=Hospital.Status.ENROLLED,
            dataset_summary=summary,
        )
        for i in range(3)
    ]
    job = services.job_create(
        actor=actor,
        data={
            "name": "bench",
            "model": "small_cnn",
            "num_classes": 2,
            "mode": "vanilla",
            "cuts": ["pool1"],
            "client_optimizer": {"name": "sgd", "lr": 0.05},
            "server_optimizer": {"name": "sgd", "lr": 0.05},
            "batch_size": 16,
            "local_epochs": 1,
            "rounds": 3,
            "codec": "none",
            "seed": 0,
            "on_failure": "retry",
            "max_retries": 1,
            "participants": [{"hospital": h.slug} for h in hospitals],
        },
    )
    services.job_transition(job=job, to="scheduled", actor=actor)
    services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    services.turn_record_progress(
        turn=turn, steps=5, samples=80, bytes_up=10**6, bytes_down=10**6, loss=0.5
    )
    _fill_audit_log(audit_rows, AuditEvent, AuditChainHead, content_hash)
    # As after any bulk load: settle statistics and visibility now, so autovacuum does
    # not run on one of the two databases in the middle of a measurement.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    verified = audit_verify_chain()
    if not verified.ok or verified.checked != audit_rows:
        raise RuntimeError(f"the seeded audit log does not verify: {verified}")
    client = Client()
    client.force_login(admin)
    print(json.dumps({"job_id": job.pk, "session": client.cookies["sessionid"].value}))
    return 0


def _fill_audit_log(target: int, AuditEvent, AuditChainHead, content_hash) -> None:
    """Extend the chain to ``target`` rows in bulk, hashing each row as audit_record does.

    The model's manager refuses bulk inserts (rows come only through audit_record, one
    at a time) and a trigger lets the head advance one event at a time; seeding 10^5
    rows that way would take minutes, so in this throw-away database the bench writes
    the same rows, correctly chained, through Django's plain QuerySet, with the head's
    trigger off for the one jump (``audit_verify`` accepts the result).
    """
    from django.db import connection, models, transaction
    from django.utils import timezone

    plain = models.QuerySet(model=AuditEvent)
    head_table = AuditChainHead._meta.db_table

    with transaction.atomic():
        head = AuditChainHead.objects.select_for_update().get()
        batch = []
        for n in range(head.last_id + 1, target + 1):
            event = AuditEvent(
                id=n,
                prev_hash=head.last_hash,
                created_at=timezone.now(),
                actor_kind="system",
                actor="system",
                action="bench.filler",
                target=f"row:{n}",
                hospital="hospital-0",
                job_id=None,
                details={"n": n},
                source_ip=None,
            )
            event.hash = content_hash(event.content())
            head.last_id, head.last_hash = event.id, event.hash
            batch.append(event)
            if len(batch) == 5000:
                plain.bulk_create(batch)
                batch = []
        plain.bulk_create(batch)
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {head_table} DISABLE TRIGGER USER")
            head.save(update_fields=["last_id", "last_hash"])
            cursor.execute(f"ALTER TABLE {head_table} ENABLE TRIGGER USER")


if __name__ == "__main__":
    sys.exit(main())
