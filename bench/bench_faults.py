"""Faults during a three-hospital job: what each costs, and whether the weights survive.

Runs ``bench/fault_matrix.py`` and ``bench/fault_link.py`` under pytest (they use the
test suite's live coordinator, database and process fixtures), one real job per fault:
a worker and an agent killed with SIGKILL mid-step, the relay restarted empty at four
points of a turn (handshake, mid-step, between steps, during the hand-off), and the
hospital's network link cut for 30 s (in a network namespace, over TLS). Per fault it
prints the steps recomputed against the checkpoint interval, the steps applied twice
(goal 0), the recovery time, and whether the final weights equal the undisturbed run's
and unsplit training's (goal: all equal)::

    .venv/bin/python bench/bench_faults.py                        # every fault
    .venv/bin/python bench/bench_faults.py --faults relay_mid_step agent_sigkill
    .venv/bin/python bench/bench_faults.py --json

The undisturbed job always runs first: the others are compared with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from report import table, today

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
#: The cases of ``fault_matrix.py``, in the order they run.
FAULTS = (
    "none",
    "worker_sigkill",
    "agent_sigkill",
    "relay_handshake",
    "relay_mid_step",
    "relay_between_steps",
    "relay_handoff",
)
#: The case of ``fault_link.py``.
LINK = "link_cut_30s"

#: What each fault is, for the table.
WHAT = {
    "none": "none (undisturbed)",
    "worker_sigkill": "worker SIGKILL mid-step",
    "agent_sigkill": "agent SIGKILL mid-step",
    "relay_handshake": "relay restart at the handshake",
    "relay_mid_step": "relay restart mid-step",
    "relay_between_steps": "relay restart between steps",
    "relay_handoff": "relay restart during the hand-off",
    LINK: "link cut for 30 s mid-step",
}


def run(faults: list[str]) -> list[dict[str, object]]:
    """Run the selected cases; their results in order."""
    with tempfile.TemporaryDirectory(prefix="medsplit-bench-faults-") as folder:
        out = Path(folder) / "faults.jsonl"
        env = {
            **os.environ,
            "MEDSPLIT_FAULTS_OUT": str(out),
            "MEDSPLIT_FAULTS": " ".join(f for f in faults if f != LINK),
        }
        files = [str(BENCH / "fault_matrix.py")]
        if LINK in faults:
            files.append(str(BENCH / "fault_link.py"))
        if faults == [LINK]:
            env["MEDSPLIT_FAULTS"] = "none"
        # One process (`-n 0`, against the suite's two in pyproject.toml): the cases are
        # timed, and another case beside one would be in its figures.
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                "-rs",
                *files,
            ],
            cwd=REPO,
            env=env,
            stdout=sys.stderr,
        )
        lines = out.read_text().splitlines() if out.exists() else []
        results = [json.loads(line) for line in lines]
    if completed.returncode != 0:
        ran = ", ".join(str(r["fault"]) for r in results) or "none"
        print(f"pytest exited with {completed.returncode} (cases recorded: {ran})", file=sys.stderr)
    if not results:
        raise SystemExit("no fault case ran to the end")
    return results


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = []
    for r in result["faults"]:  # type: ignore[union-attr]
        undisturbed = r["equal_undisturbed"]
        rows.append(
            [
                WHAT.get(r["fault"], r["fault"]),
                f"{r['recomputed']} (every {r['checkpoint_every']})",
                r["applied_twice"],
                "–" if r.get("recovery_s") is None else f"{r['recovery_s']:.1f} s",
                f"{r['seconds']:.0f} s",
                r["runner_starts"],
                r["handoffs_put_back"],
                "yes" if r["equal_unsplit"] else "**no**",
                "–" if undisturbed is None else ("yes" if undisturbed else "**no**"),
            ]
        )
    return table(
        [
            f"fault ({today()}, {result['steps']} steps)",
            "steps recomputed (checkpoint interval)",
            "steps applied twice",
            "recovery",
            "job",
            "runner starts",
            "hand-offs put back",
            "= unsplit",
            "= undisturbed",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="+", choices=[*FAULTS, LINK], default=[*FAULTS, LINK])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    faults = run(list(args.faults))
    result = {"steps": faults[0]["steps"], "faults": faults}
    if args.json:
        print(json.dumps(result))
    else:
        print(markdown(result))
    failed = [r["fault"] for r in faults if not r["equal_unsplit"] or r["applied_twice"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
