"""Invariant 7: a hospital's own privacy audit keeps its pictures at home. A real agent
process runs ``privacy-audit`` against a listening "coordinator" socket: nothing connects
to it, and the picture and figures are written only inside the work directory's
``privacy/`` folder, which only the agent's user can open."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

from tests import zygote

ROOT = Path(__file__).resolve().parents[2]


def test_the_audit_connects_to_no_one_and_writes_only_in_its_work_dir(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    config = tmp_path / "agent.toml"
    config.write_text(
        f'coordinator_url = "http://127.0.0.1:{port}"\n'
        f'work_dir = "{tmp_path / "work"}"\n'
        '[data]\nkind = "synthetic"\nsamples = 60\nshape = [1, 16, 16]\n'
    )
    args = ["--model", "small_cnn", "--cut", "conv1", "--train-steps", "2"]
    args += ["--decoder-steps", "3", "--batch-size", "16"]
    done = zygote.run(
        [sys.executable, "-m", "hospital_agent", "privacy-audit", "--config", str(config), *args],
        timeout=120,
        cwd=ROOT,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        connection = None
    finally:
        listener.close()
    assert connection is None, "the audit contacted the coordinator"
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [
        Path("agent.toml"),
        Path("work/privacy/small_cnn-vanilla-conv1.json"),
        Path("work/privacy/small_cnn-vanilla-conv1.png"),
    ]
    assert stat.S_IMODE((tmp_path / "work" / "privacy").stat().st_mode) == 0o700
    # The figures are numbers and names: no pixel values in the JSON.
    assert len((tmp_path / "work/privacy/small_cnn-vanilla-conv1.json").read_text()) < 2000
