"""The README's demo (``scripts/demo.py``) as a real process, for the tests that drive it:
its output read line by line as it comes, what it printed looked up, Ctrl-C sent."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO / "frontend" / "vendor" / "chart.umd.min.js"
#: Small settings: the point of these runs is the platform, not learning.
QUICK = ("--rounds", "1", "--local-epochs", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DemoRun:
    """``scripts/demo.py`` started with ``args`` in ``work``; ``env`` replaces the
    environment's ``REDIS_URL`` (``None``: unset)."""

    def __init__(self, work: Path, *args: str, redis_url: str | None) -> None:
        if not VENDOR.exists():
            pytest.skip(
                "the dashboard's scripts are not built (cd frontend && npm ci && npm run build)"
            )
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        self.work = work
        self.port = free_port()
        command = [sys.executable, "scripts/demo.py", "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--work-dir", str(work), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self._new_line.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first line holding ``needle``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._new_line:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                if self.process.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(
                        f"the demo ended (exit {self.process.returncode}) before printing "
                        f"{needle!r}:\n{self.output}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {needle!r} within {timeout:.0f} s:\n{self.output}")
                self._new_line.wait(min(left, 1.0))

    def found(self, pattern: str) -> re.Match[str]:
        """The first match of ``pattern`` in what the demo printed so far."""
        match = re.search(pattern, self.output)
        assert match, f"nothing matches {pattern!r} in:\n{self.output}"
        return match

    @property
    def prefix(self) -> str:
        """This run's Redis prefix, as it printed it."""
        return self.found(r"every Redis key and user of this run starts with (demo-[0-9a-f]+)")[1]

    @property
    def password(self) -> str:
        return self.found(r"sign in as admin, password (\S+?)\)")[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def interrupt(self, timeout: float = 90) -> int:
        """Ctrl-C, then the exit code once every line is read."""
        self.process.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def still_running(work: Path) -> list[str]:
    """Processes whose environment names the demo's folder: every process the demo starts
    (Redis included) gets its ``MEDSPLIT_DATA_DIR``, and nothing else has it."""
    needle = f"={work}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
