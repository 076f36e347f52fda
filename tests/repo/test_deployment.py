"""The docker-compose deployment: valid (`docker-compose config`, no engine needed), every
service there with a health check where it serves, and no secret in the repository."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
SERVICES = {
    "postgres",
    "redis",
    "coordinator",
    "proxy",
    "worker",
    "scheduler",
    "agent-1",
    "agent-2",
    "agent-3",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The compose file with env files made from the examples, as an operator would."""
    shutil.copy(COMPOSE, tmp_path / "docker-compose.yml")
    (tmp_path / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "nginx.conf", tmp_path / "deploy" / "nginx.conf")
    for example in (REPO / "deploy").glob("*.env.example"):
        text = re.sub(r"=$", "=not-a-real-secret-0123456789", example.read_text(), flags=re.M)
        (tmp_path / "deploy" / example.name.removesuffix(".example")).write_text(text)
    return tmp_path


def compose(project: Path, *args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("Debian's docker-compose is not installed (scripts/test installs it)")
    return subprocess.run(
        [binary, "--env-file", "deploy/secrets.env", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_compose_file_is_valid_and_has_every_service(project: Path) -> None:
    checked = compose(project, "config")
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(checked.stdout)
    assert set(config["services"]) == SERVICES
    for name in ("postgres", "redis", "coordinator", "proxy", "agent-1", "agent-2", "agent-3"):
        assert "healthcheck" in config["services"][name], name
    for name in ("agent-1", "agent-2", "agent-3"):
        volumes = [str(v) for v in config["services"][name]["volumes"]]
        assert any("/var/lib/medsplit-agent" in v for v in volumes), "keys on its own volume"
    redis = config["services"]["redis"]
    assert redis["command"] == ["sh", "/usr/local/lib/medsplit/redis-start.sh"]
    assert any(str(v).endswith("/data") or "relay-users" in str(v) for v in redis["volumes"])


def test_the_coordinator_is_reached_through_the_proxy_only(project: Path) -> None:
    """It trusts one proxy's X-Forwarded-For, so nothing else may reach its gunicorn:
    only the proxy publishes a port, and agents are not on the coordinator's network."""
    checked = compose(project, "config")
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    coordinator, proxy = services["coordinator"], services["proxy"]
    assert "ports" not in coordinator
    assert [str(p["published"]) for p in proxy["ports"]] == ["8000"]
    env = coordinator["environment"]
    assert env["MEDSPLIT_TRUSTED_PROXIES"] == "1"
    assert env["MEDSPLIT_CACHE_URL"].startswith("redis://")
    assert any("deploy/nginx.conf" in str(v) for v in proxy["volumes"])
    assert "X-Forwarded-For $remote_addr;" in (REPO / "deploy" / "nginx.conf").read_text()
    for name in ("agent-1", "agent-2", "agent-3"):
        agent = services[name]
        assert agent["environment"]["MEDSPLIT_AGENT_COORDINATOR_URL"] == "http://proxy:8000"
        assert set(agent["networks"]) == {"edge"}
    assert "edge" not in coordinator["networks"] and "edge" not in services["postgres"]["networks"]


def test_a_missing_secret_is_refused_by_name(project: Path) -> None:
    (project / "deploy" / "secrets.env").write_text("REDIS_PASSWORD=x\n")
    refused = compose(project, "config", "-q")
    assert refused.returncode != 0
    assert "POSTGRES_PASSWORD" in refused.stderr


def test_no_secret_is_in_the_repository() -> None:
    text = COMPOSE.read_text()
    # Every password is a ${VARIABLE} from the env files, never a value.
    for line in text.splitlines():
        if re.search(r"PASSWORD\s*[:=]", line) and "${" not in line:
            pytest.fail(f"a password set in docker-compose.yml: {line.strip()}")
    for example in (REPO / "deploy").glob("*.env.example"):
        for line in example.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                name, value = line.split("=", 1)
                if any(w in name for w in ("PASSWORD", "SECRET", "CODE")):
                    assert value == "", f"{example.name}: {name} has a value"
    ignored = subprocess.run(
        ["git", "check-ignore", "deploy/secrets.env", "deploy/agent-1.env"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == ["deploy/secrets.env", "deploy/agent-1.env"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_relay(acl: Path, port: int, password: str) -> subprocess.Popen:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("no redis-server on this machine")
    env = {**os.environ, "REDIS_PASSWORD": password, "REDIS_ACL_FILE": str(acl)}
    env["REDIS_SERVER"] = server
    process = subprocess.Popen(
        ["sh", str(REPO / "deploy" / "redis-start.sh"), "--port", str(port), "--bind", "127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port, password=password, socket_timeout=1).ping()
            return process
        except redis.ConnectionError:
            assert process.poll() is None, "redis-start.sh exited"
            time.sleep(0.05)
    process.kill()
    raise AssertionError("the relay did not start")


FIRST = "first-relay-password-0123456789-abcdefghijkl"
SECOND = "second-relay-password-0123456789-abcdefghijk"


def test_the_relay_keeps_its_users_and_takes_the_password_of_each_start(tmp_path: Path) -> None:
    """deploy/redis-start.sh, as the compose file's redis service runs it."""
    acl, port = tmp_path / "users.acl", _free_port()
    relay = _start_relay(acl, port, FIRST)
    try:
        admin = redis.Redis(port=port, password=FIRST)
        admin.execute_command(
            "ACL", "SETUSER", "hospital-x", "on", ">pw-of-x", "~medsplit:*:x:*", "+ping"
        )
        admin.execute_command("ACL", "SAVE")
        assert acl.stat().st_mode & 0o077 == 0, "the ACL file is for Redis's eyes only"
        assert FIRST not in acl.read_text(), "passwords are kept as SHA-256"
    finally:
        relay.kill()
        relay.wait()
    relay = _start_relay(acl, port, SECOND)
    try:
        assert redis.Redis(port=port, username="hospital-x", password="pw-of-x").ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password=FIRST).ping()
        assert acl.read_text().count("user default ") == 1
    finally:
        relay.kill()
        relay.wait()
