"""The README's demo (`scripts/demo.py`, after `scripts/demo` installed everything): the
whole platform on this machine runs a two-round job to its test accuracy and AUC, and
Ctrl-C leaves no process behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo(work: Path, *args: str) -> subprocess.Popen:
    if not (REPO / "frontend" / "vendor" / "chart.umd.min.js").exists():
        pytest.skip(
            "the dashboard's scripts are not built (cd frontend && npm ci && npm run build)"
        )
    command = [
        sys.executable,
        "scripts/demo.py",
        "--port",
        str(free_port()),
        "--work-dir",
        str(work),
    ]
    return subprocess.Popen(
        [*command, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def still_running(work: Path) -> list[str]:
    """Processes whose command line names the demo's folder (the demo's children do)."""
    listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if str(work) in line and "ps -eo" not in line]


def test_the_demo_runs_a_job_to_its_test_accuracy_and_auc(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    process = demo(work)
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out
    assert "password" in out and "shown once" in out
    assert "http://127.0.0.1:" in out
    assert "completed" in out
    assert "done: test accuracy" in out and "AUC" in out
    time.sleep(1)
    assert not still_running(work), still_running(work)


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    process = demo(work, "--rounds", "20")
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if "round 1" in line:  # every part is up and a turn is running
            break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 130, "".join(lines) + rest
    assert "every process stopped" in rest
    time.sleep(1)
    assert not still_running(work), still_running(work)
