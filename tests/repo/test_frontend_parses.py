"""Every dashboard script parses as a JavaScript module (``node --check``, fed on
standard input as a module: a ``.js`` path would be checked as CommonJS, which passes a
module's errors by): one that does not
breaks the whole single-page app, and the browser tests would only time out, each on
its own page, without saying which file or line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "frontend" / "src"
SCRIPTS = sorted(SRC.rglob("*.js"))


def test_there_are_scripts_to_check() -> None:
    assert SCRIPTS, f"no dashboard scripts under {SRC}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(SRC)))
def test_a_dashboard_script_parses(script: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "--input-type=module", "--check"],
        input=script.read_text(encoding="utf-8"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
