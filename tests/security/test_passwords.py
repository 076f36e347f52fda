"""Attack: guess the relay's password online.

Redis answers tens of thousands of ``AUTH`` attempts a second and nothing slows a guesser
down, so a password an operator supplies must be a machine secret. Before, the workers'
password needed 16 characters and the others nothing. Now every process refuses to start
with a guessable one, and so does the relay's own start script.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from medsplit.passwords import MIN_BITS, WeakPasswordError, check_password, estimated_bits

REPO = Path(__file__).resolve().parents[2]
WEAK = "Aa1!Bb2@Cc3#Dd4$"  # 16 characters of every kind: accepted before, about 105 bits


@pytest.mark.parametrize(
    "password",
    [WEAK, "correct-horse-battery-staple", "a" * 64, "0123456789" * 4, ""],
    ids=["16-of-every-kind", "a-passphrase", "one-character", "digits", "empty"],
)
def test_guessable_passwords_are_refused_naming_the_setting(password: str) -> None:
    with pytest.raises(WeakPasswordError, match="REDIS_URL is too weak") as refused:
        check_password(password, what="the password in REDIS_URL")
    assert "secrets.token_urlsafe(32)" in str(refused.value)


def test_generated_secrets_pass() -> None:
    for _ in range(20):
        check_password(secrets.token_urlsafe(32), what="x")
    assert estimated_bits(secrets.token_urlsafe(32)) >= 2 * MIN_BITS - 24


def _manage(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "MEDSPLIT_DATA_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "variable", ["REDIS_URL", "MEDSPLIT_WORKER_REDIS_URL", "CELERY_BROKER_URL"]
)
def test_the_coordinator_and_the_workers_refuse_to_start_with_a_weak_one(
    variable: str, tmp_path: Path
) -> None:
    weak = _manage({variable: f"redis://someone:{WEAK}@127.0.0.1:6379/0"}, tmp_path)
    assert weak.returncode != 0
    assert f"the password in {variable} is too weak" in weak.stderr
    assert WEAK not in weak.stderr, "the message never repeats the password"
    strong = _manage(
        {variable: f"redis://someone:{secrets.token_urlsafe(32)}@127.0.0.1:6379/0"}, tmp_path
    )
    assert strong.returncode == 0, strong.stderr


def test_the_relay_refuses_to_start_with_a_weak_password(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on this machine (Debian's redis-server package)")
    started = subprocess.run(
        ["sh", str(REPO / "deploy" / "redis-start.sh"), "--port", "0"],
        env={
            **os.environ,
            "REDIS_PASSWORD": "x" * 40,  # long, but one character
            "REDIS_ACL_FILE": str(tmp_path / "users.acl"),
            "REDIS_SERVER": binary,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 2
    assert "REDIS_PASSWORD is too weak" in started.stderr
    assert not (tmp_path / "users.acl").exists(), "nothing was started or written"
