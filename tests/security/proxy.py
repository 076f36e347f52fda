"""The coordinator as docs/deploy.md runs it, for the attacker tests: Debian's nginx with
``deploy/nginx.conf`` in front of gunicorn (2 processes, threaded), on the test's
database (PostgreSQL when ``DATABASE_URL`` points at it, else the SQLite file), with a
Redis 7 of its own as the shared cache and ``MEDSPLIT_TRUSTED_PROXIES=1``.

Clients connect from chosen loopback addresses (127.0.0.2, 127.0.0.3, ...), so that each
is a different client to nginx, whatever ``X-Forwarded-For`` they send.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests
from requests.adapters import HTTPAdapter

from tests.workers.processes import RedisServer, database_url, free_port

REPO = Path(__file__).resolve().parents[2]
GUNICORN_WORKERS = 2
GUNICORN_THREADS = 4
#: Long-polls one gunicorn process holds at once (MEDSPLIT_LONG_POLLS_PER_PROCESS).
LONG_POLLS_PER_PROCESS = 2


def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.skip("no nginx on this machine: install Debian's package (apt-get install nginx)")
    return found


def nginx_config(folder: Path, *, port: int, upstream: int) -> str:
    """``deploy/nginx.conf`` listening on ``port`` and passing to ``upstream``, inside the
    top-level settings a package's nginx.conf would give it (pid, logs, temp paths here)."""
    server = (REPO / "deploy" / "nginx.conf").read_text()
    server, listens = re.subn(r"listen 8000;", f"listen 127.0.0.1:{port};", server)
    server, passes = re.subn(
        r"proxy_pass http://coordinator:8000;", f"proxy_pass http://127.0.0.1:{upstream};", server
    )
    assert listens == passes == 1, "deploy/nginx.conf changed: update the test's edits"
    temp = folder / "nginx-temp"
    temp.mkdir(exist_ok=True)
    paths = "\n".join(
        f"    {kind}_temp_path {temp / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # As root, nginx's workers would run as nobody, who cannot enter pytest's folders.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {folder / 'nginx.pid'};\n"
        f"error_log {folder / 'nginx-error.log'} info;\n"
        "events { worker_connections 512; }\n"
        f"http {{\n    access_log {folder / 'nginx-access.log'};\n{paths}\n{server}\n}}\n"
    )


class _FromAddress(HTTPAdapter):
    """Connects from ``address`` (any 127.x.y.z is this machine's loopback)."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


@dataclass
class Deployment:
    """nginx, gunicorn and their Redis, started by :meth:`start`."""

    folder: Path
    port: int = field(default_factory=free_port)
    upstream: int = field(default_factory=free_port)
    cache: RedisServer | None = None
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, address: str = "127.0.0.2") -> requests.Session:
        """A client connecting from ``address``, with cookies (like a browser)."""
        session = requests.Session()
        session.mount("http://", _FromAddress(address))
        return session

    def start(self) -> None:
        nginx = nginx_binary()
        self.cache = RedisServer(self.folder)
        self.cache.start()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
            "DJANGO_SETTINGS_MODULE": "tests.security.coordinator_settings",
            "DATABASE_URL": database_url(),
            "MEDSPLIT_CACHE_URL": self.cache.url,
            "MEDSPLIT_TRUSTED_PROXIES": "1",
            "MEDSPLIT_LONG_POLLS_PER_PROCESS": str(LONG_POLLS_PER_PROCESS),
            "MEDSPLIT_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "MEDSPLIT_THROTTLE_SIGN_IN": "10/minute",
            "MEDSPLIT_THROTTLE_CUT_TABLE": "30/minute",
            "MEDSPLIT_DATA_DIR": str(self.folder / "data"),
            "MEDSPLIT_LOG_LEVEL": "WARNING",
        }
        for name in ("MEDSPLIT_DJANGO_ADMIN", "MEDSPLIT_DEBUG", "MEDSPLIT_SIGN_IN_FREE_FAILURES"):
            env.pop(name, None)
        self._spawn(
            "gunicorn",
            [
                sys.executable,
                *("-m", "gunicorn", "coordinator.wsgi", "--chdir", "platform"),
                *("--workers", str(GUNICORN_WORKERS), "--worker-class", "gthread"),
                *("--threads", str(GUNICORN_THREADS), "-b", f"127.0.0.1:{self.upstream}"),
                *("--access-logfile", str(self.folder / "gunicorn-access.log")),
                # The process id first: which of the two processes answered.
                *("--access-logformat", '%(p)s %(h)s "%(r)s" %(s)s'),
            ],
            env,
        )
        config = self.folder / "nginx.conf"
        config.write_text(nginx_config(self.folder, port=self.port, upstream=self.upstream))
        self._spawn(
            "nginx",
            [nginx, "-p", str(self.folder), "-c", str(config), "-e", str(self.folder / "e.log")],
            env,
        )
        self._warm_up()

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        self.processes[name] = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )

    def _warm_up(self, timeout: float = 90.0) -> None:
        """Until both gunicorn processes have answered (each imports the URLs, and with
        them torch, at its first request)."""
        deadline = time.monotonic() + timeout
        client = self.client("127.0.0.1")
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                assert process.poll() is None, f"{name} exited:\n{self.logs()}"
            try:
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(lambda _: client.get(f"{self.url}/api/auth/me/"), range(4)))
            except requests.RequestException:
                time.sleep(0.2)
                continue
            if len(self.answering_pids()) >= GUNICORN_WORKERS:
                self.reset()
                return
        raise RuntimeError(f"the deployment did not start:\n{self.logs()}")

    def answering_pids(self, path: str = "") -> set[str]:
        """Ids of the gunicorn processes that answered requests for ``path`` so far."""
        log = self.folder / "gunicorn-access.log"
        if not log.exists():
            return set()
        return {
            line.split(" ", 1)[0]
            for line in log.read_text().splitlines()
            if f" {path}" in line or not path
        }

    def reset(self) -> None:
        """Forget every throttle, delay and slot (the cache), and the access log."""
        assert self.cache is not None
        client = redis.Redis.from_url(self.cache.url)
        try:
            client.flushall()
        finally:
            client.close()
        (self.folder / "gunicorn-access.log").write_text("")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.cache is not None:
            self.cache.stop()

    def logs(self) -> str:
        parts = []
        for name in ("gunicorn", "nginx", "nginx-error"):
            path = self.folder / f"{name}.log"
            if path.exists():
                parts.append(f"----- {name} -----\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="session")
def _deployment(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup, django_db_blocker
) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path_factory.mktemp("deployment"))
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()  # before the test database is dropped: it holds connections


@pytest.fixture
def deployment(_deployment: Deployment, transactional_db) -> Iterator[Deployment]:
    """The deployment, with a clean cache; the test's rows are committed, so its
    processes see them."""
    _deployment.reset()
    yield _deployment
