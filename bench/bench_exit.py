"""How long a party's process takes to exit once its work is done, with its start-up
objects frozen out of the cycle collector (``medsplit.runtime.freeze_start_up``) and
without, side by side.

Run from the repository root::

    python bench/bench_exit.py --repeats 5

Each repetition starts two interpreters that import what an agent imports
(``hospital_agent.cli`` and ``hospital_agent.service``: torch, MONAI, the agent's code),
one with ``MEDSPLIT_FREEZE_START_UP=0`` and one without, in alternating order. Each
writes the time when its script ends; the exit is the time from then until the process
is gone (the interpreter's teardown: atexit, its last collection, the modules freed).
Nothing here asserts on time: the figures are printed, as a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import command_line, environment, table, today

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys, time
import hospital_agent.cli, hospital_agent.service
from medsplit.runtime import freeze_start_up
frozen = freeze_start_up()
open(sys.argv[1], "w").write(f"{time.time()!r} {frozen}")
"""


def exit_seconds(freeze: bool, mark: Path) -> tuple[float, int]:
    """One interpreter's exit time and how many objects it froze."""
    env = {**os.environ, "MEDSPLIT_FREEZE_START_UP": "1" if freeze else "0"}
    subprocess.run([sys.executable, "-c", SCRIPT, str(mark)], cwd=REPO, env=env, check=True)
    gone = time.time()
    ended, frozen = mark.read_text().split()
    return gone - float(ended), int(frozen)


def measure(repeats: int) -> dict[str, object]:
    runs: dict[str, list[float]] = {"frozen": [], "not frozen": []}
    frozen_objects = 0
    with tempfile.TemporaryDirectory() as folder:
        mark = Path(folder) / "ended"
        for i in range(repeats):
            order = [True, False] if i % 2 == 0 else [False, True]
            for freeze in order:
                seconds, count = exit_seconds(freeze, mark)
                runs["frozen" if freeze else "not frozen"].append(seconds)
                frozen_objects = max(frozen_objects, count)
    median = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "date": today(),
        "command": command_line("bench_exit.py", None),
        "environment": environment(),
        "load_average": os.getloadavg()[0],
        "repeats": repeats,
        "frozen_objects": frozen_objects,
        "exit_seconds": runs,
        "median_seconds": median,
        "ratio": median["not frozen"] / median["frozen"],
    }


def markdown(result: dict) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = [
        [
            name,
            f"{result['median_seconds'][name]:.3f} s",
            ", ".join(f"{s:.2f}" for s in result["exit_seconds"][name]),
        ]
        for name in ("not frozen", "frozen")
    ]
    return (
        f"Measured {result['date']} (`{result['command']}`), {result['repeats']} repetitions, "
        f"1-minute load average {result['load_average']:.1f}; "
        f"{result['frozen_objects']:,} objects frozen.\n\n"
        + table(["agent's imports, then exit", "median exit", "each run (s)"], rows)
        + f"\n\nNot frozen ÷ frozen: **{result['ratio']:.1f}**."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.repeats)
    print(json.dumps(result) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
