"""A real three-node Redis Cluster for tests: ``redis-server`` processes in cluster mode on
loopback ports, in a temporary folder, slots split in three, killed afterwards."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

SLOTS = 16384


def _free_cluster_port() -> int:
    """A loopback port free both for clients and for its cluster bus (port + 10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 >= 65536:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports for a cluster node")


@dataclass
class LocalCluster:
    """Three primaries, no replicas; ``default`` is the admin user, with a password."""

    folder: Path
    nodes: int = 3
    password: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    ports: list[int] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def url(self, user: str = "default", password: str | None = None, *, tls: bool = False) -> str:
        """The cluster URL through the first node (``redis+cluster://``)."""
        scheme = "rediss+cluster" if tls else "redis+cluster"
        return f"{scheme}://{user}:{password or self.password}@127.0.0.1:{self.ports[0]}/0"

    def node_admin(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, socket_timeout=5)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server on this machine (Debian's redis-server package)")
        for _ in range(self.nodes):
            port = _free_cluster_port()
            where = self.folder / f"node-{port}"
            where.mkdir()
            log = open(where / "redis.log", "ab")  # noqa: SIM115 - the process keeps it
            self.processes.append(
                subprocess.Popen(
                    [
                        *(binary, "--port", str(port), "--bind", "127.0.0.1"),
                        *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                        *("--dir", str(where), "--save", "", "--appendonly", "no"),
                        *("--requirepass", self.password, "--cluster-node-timeout", "2000"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            self.ports.append(port)
        clients = [self._wait_up(port) for port in self.ports]
        share = SLOTS // self.nodes
        for n, client in enumerate(clients):
            last = SLOTS - 1 if n == self.nodes - 1 else (n + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", n * share, last)
        # Every node meets every other at once: no waiting for gossip to introduce them.
        for n, client in enumerate(clients):
            for port in self.ports[n + 1 :]:
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            infos = [c.cluster("info") for c in clients]
            known = [int(i.get("cluster_known_nodes", 0)) for i in infos]
            if all(i.get("cluster_state") == "ok" for i in infos) and min(known) == self.nodes:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the cluster did not come up: {infos}")
        for c in clients:
            c.close()

    def _wait_up(self, port: int) -> redis.Redis:
        client = self.node_admin(port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return client
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"cluster node on port {port} did not start ({self.folder})")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A three-node cluster for the session (started once: about a second)."""
    with tempfile.TemporaryDirectory(prefix="medsplit-cluster-") as folder:
        cluster = LocalCluster(Path(folder))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
