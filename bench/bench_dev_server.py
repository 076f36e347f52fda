"""Benchmark: an agent's request to the development server, with Nagle's algorithm on
(Django's ``WSGIServer``) and off (``coordinator.dev_server``), side by side.

Run from the repository root::

    .venv/bin/python bench/bench_dev_server.py              # a table
    .venv/bin/python bench/bench_dev_server.py --json

Both servers run in this process on loopback, each serving one WSGI app that answers
with a body of ``--bytes`` (an agent's long-poll answer is 58-186 KB with 3-10
hospitals; a hand-off record's answer is 220 bytes). One ``requests`` session per
server, kept alive as an agent's is, asks each in turn, alternating, ``--requests``
times; the figures are the medians. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")

from report import command_line, environment, table, today  # noqa: E402


def _serve(server_class: type, body: bytes) -> tuple[object, str]:
    from django.core.servers.basehttp import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    def app(environ: dict, start_response) -> list[bytes]:
        start_response(
            "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]

    server = server_class(("127.0.0.1", 0), Quiet)
    server.set_app(app)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def run(*, size: int, requests_: int, command: str) -> dict:
    import django

    django.setup()
    import requests
    from django.core.servers.basehttp import ThreadedWSGIServer

    from coordinator.dev_server import NoDelayThreadedWSGIServer

    body = b"x" * size
    servers = {
        "Django's server (Nagle on)": ThreadedWSGIServer,
        "coordinator.dev_server (TCP_NODELAY)": NoDelayThreadedWSGIServer,
    }
    started = {name: _serve(cls, body) for name, cls in servers.items()}
    sessions = {name: requests.Session() for name in servers}
    times: dict[str, list[float]] = {name: [] for name in servers}
    for i in range(requests_ + 3):
        for name, (_, url) in started.items():
            began = time.perf_counter()
            response = sessions[name].get(url, timeout=10)
            assert len(response.content) == size
            if i >= 3:  # the connection's first requests are acknowledged at once
                times[name].append((time.perf_counter() - began) * 1000)
    for server, _ in started.values():
        server.shutdown()
        server.server_close()
    medians = {name: statistics.median(t) for name, t in times.items()}
    before, after = medians.values()
    return {
        "date": today(),
        "command": command,
        "bytes": size,
        "requests": requests_,
        "median_ms": medians,
        "ratio": before / after,
        "environment": environment(),
    }


def markdown(result: dict) -> str:
    rows = [[name, f"{ms:.2f}"] for name, ms in result["median_ms"].items()]
    return "\n".join(
        [
            table(
                [f"server ({result['date']}), {result['bytes']:,}-byte answers", "median ms"], rows
            ),
            "",
            f"Nagle on / off: **{result['ratio']:.1f}** (medians of {result['requests']} "
            f"kept-alive requests each, alternating; `{result['command']}`).",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=58_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(
        size=args.bytes,
        requests_=args.requests,
        command=command_line("bench_dev_server.py", argv),
    )
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
