"""Run every benchmark and rewrite its tables in ``docs/benchmarks.md``.

Run from the repository root, with PostgreSQL and Redis reachable::

    .venv/bin/python bench/run_all.py                  # every benchmark, default sizes
    .venv/bin/python bench/run_all.py --quick          # smaller runs (minutes, noisier)
    .venv/bin/python bench/run_all.py --only bench_relay bench_traffic
    .venv/bin/python bench/run_all.py --list

Each benchmark runs as its own process (``python bench/NAME.py --json ...``), one after
the other, so that no two compete for the cores. Its JSON is kept under ``--results``
(default ``var/bench/<date>/``), then the script's ``markdown(result)`` renders the tables
that replace the part between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the
document; the prose around the markers is written by hand and stays. The document is
rewritten after each benchmark, so a failure later on keeps what was measured. A failed
benchmark leaves its section as it was; the command then exits with 1 and names it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from report import SectionError, replace_section, sections, today

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DOC = REPO / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Benchmark:
    """One run of a script: its arguments for a full run and for ``--quick``, and how long
    it takes. ``name`` is its section in the document (and its JSON result's file);
    ``script`` the ``bench/`` script it runs, by default the one of that name (a script
    run twice with different arguments, as ``bench_hijack`` for SplitOut and SplitGuard,
    has one entry a section)."""

    name: str
    minutes: float
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    script: str = ""

    def __post_init__(self) -> None:
        if not self.script:
            object.__setattr__(self, "script", self.name)


# In the document's order. Minutes: what a full run took on the 2-core machine when quiet
# (2026-11-30, 18 minutes in all; about 25 with bench_splitfed and bench_psi, 2026-12-01;
# bench_vertical's 9 were measured at a load of 4 to 5);
# under other load they grow several times.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("bench_accuracy", 4, (), ("--seeds", "0", "--epochs", "3")),
    Benchmark("bench_overhead", 1.5, (), ("--steps", "8")),
    Benchmark("bench_rpc_peer", 2, (), ("--blocks", "2", "--steps", "5")),
    Benchmark("bench_traffic", 1.5, (), ("--case", "small_cnn")),
    Benchmark("bench_scaling", 1.5, (), ("--hospitals", "1", "3", "--steps", "5", "--rounds", "1")),
    # A few seconds (2026-12-07).
    Benchmark("bench_dev_server", 0.1, (), ("--requests", "10")),
    Benchmark("bench_split_step", 0.5, ("--repeats", "15"), ("--repeats", "5")),
    Benchmark("bench_frames", 0.2, ("--repeats", "9"), ("--repeats", "3")),
    Benchmark("bench_audit", 0.2, (), ("--appends", "800")),
    Benchmark(
        "bench_status_endpoint",
        2,
        ("--runs", "6", "--requests", "250"),
        ("--runs", "2", "--requests", "100", "--sizes", "1000", "20000"),
    ),
    Benchmark("bench_relay", 0.1, (), ("--repeats", "9")),
    Benchmark(
        "bench_step_breakdown", 3, ("--compare", "4", "--repeats", "41"), ("--repeats", "21")
    ),
    Benchmark("bench_relay_abuse", 0.3, (), ("--frame-mib", "64")),
    # About a minute on the 2 cores at a load of 4 (2026-12-03).
    Benchmark("bench_cluster", 1, ("--streams", "64"), ("--seconds", "1", "--streams", "2")),
    Benchmark("bench_runtime", 2, (), ("--steps", "10", "--memory-steps", "300")),
    Benchmark("bench_agent", 0.6, (), ("--steps", "10")),
    # About 15 s when quiet (2026-12-03).
    Benchmark("bench_exit", 0.3, (), ("--repeats", "1")),
    Benchmark("bench_faults", 12, (), ("--faults", "none", "relay_mid_step")),
    Benchmark("bench_secagg", 0.5, (), ("--repeats", "3", "--parameters", "262144")),
    Benchmark("bench_psi", 3, ("--gcs",), ("--sizes", "1000", "10000")),
    Benchmark(
        "bench_splitfed",
        7,
        (),
        ("--seeds", "0", "--epochs", "2", "--repeats", "2", "--steps", "3", "--ks", "3", "5"),
    ),
    Benchmark("bench_vertical", 9, (), ("--seeds", "0", "--epochs", "2")),
    Benchmark("bench_segmentation", 2, (), ("--seeds", "0", "--epochs", "1", "--train", "96")),
    Benchmark("bench_augment", 8, (), ("--seeds", "0", "--epochs", "2", "--limit", "192")),
    Benchmark(
        "bench_privacy", 11, (), ("--cuts", "conv1,pool2", "--train-steps", "30", "--steps", "60")
    ),
    # 11 minutes at a load of 12 on the 2 cores (2026-12-02).
    Benchmark("bench_hijack", 11, (), ("--runs", "1", "--undetected-epochs", "1")),
    # SplitGuard's rows: the same script, its probes at 30 % and two-epoch honest runs (so
    # that an honest run meets about ten fake batches). Not yet timed alone.
    Benchmark(
        "bench_hijack_splitguard",
        12,
        ("--method", "splitguard", "--probe-probability", "0.3", "--epochs", "2"),
        (
            "--runs",
            "1",
            "--undetected-epochs",
            "1",
            "--method",
            "splitguard",
            "--probe-probability",
            "0.3",
        ),
        script="bench_hijack",
    ),
    # Its four (dataset, cut) runs one after another: the longest took 22 minutes run four at
    # once at a load of 20 (2026-12-02); not yet timed alone.
    Benchmark(
        "bench_privacy_frontier",
        40,
        (),
        ("--datasets", "breastmnist", "--cuts", "conv1", "--train-steps", "3", "--steps", "5"),
    ),
    # About a minute at a load of 7 on the 2 cores (2026-12-02).
    Benchmark(
        "bench_inference", 1, ("--repeats", "15"), ("--repeats", "3", "--models", "small_cnn")
    ),
)


def by_name() -> dict[str, Benchmark]:
    return {b.name: b for b in BENCHMARKS}


class BenchmarkFailed(RuntimeError):
    """A benchmark exited with an error or printed something other than one JSON object."""


def run_one(bench: Benchmark, quick: bool, results: Path) -> dict:
    """Run ``bench`` as its own process; keep and return its JSON."""
    args = bench.quick if quick else bench.args
    # Paths relative to the repository, so that the commands the tables quote work anywhere.
    python = (
        os.path.relpath(sys.executable, REPO)
        if sys.executable.startswith(str(REPO))
        else sys.executable
    )
    command = [python, f"bench/{bench.script}.py", "--json", *args]
    # Logs and progress go straight to this terminal; only stdout is captured.
    done = subprocess.run(
        command, cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, **bench.env}
    )
    if done.returncode != 0:
        raise BenchmarkFailed(f"{bench.name} exited with {done.returncode}")
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise BenchmarkFailed(
            f"{bench.name} did not print one JSON object on stdout ({exc}); "
            f"it began: {done.stdout[:200]!r}"
        ) from exc
    result.setdefault("command", " ".join(command))
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{bench.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def render(name: str, result_file: Path) -> str:
    """The script's ``markdown(result)``, computed in a fresh process: importing some
    benchmarks sets up Django with their own settings, which must not leak into the next."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "module = __import__(sys.argv[2]); "
        "print(module.markdown(json.load(open(sys.argv[3]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), name, str(result_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchmarkFailed(f"{name}.markdown failed:\n{done.stderr[-2000:]}")
    return done.stdout


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a first look")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these benchmarks only")
    parser.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="leave these out")
    parser.add_argument("--doc", type=Path, default=DOC, help="the document to rewrite")
    parser.add_argument(
        "--results", type=Path, help="where each JSON result is kept (default var/bench/DATE)"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and stop")
    args = parser.parse_args(argv)
    known = by_name()
    for name in [*(args.only or []), *args.skip]:
        if name not in known:
            parser.error(f"no benchmark named {name!r}; known: {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [
        b for b in BENCHMARKS if (not args.only or b.name in args.only) and b.name not in args.skip
    ]
    if args.list:
        for b in BENCHMARKS:
            print(f"{b.name:<24} ~{b.minutes:g} min  {b.script}.py {' '.join(b.args)}")
        return 0
    doc = args.doc.read_text()
    missing = [b.name for b in chosen if b.name not in sections(doc)]
    if missing:
        # Checked before anything runs: an hour of measurements with nowhere to go helps nobody.
        raise SystemExit(f"{args.doc} has no marked section for: {', '.join(missing)}")
    results = args.results or REPO / "var" / "bench" / today()
    total = sum(b.minutes for b in chosen)
    print(f"{len(chosen)} benchmarks, about {total:g} minutes for full runs", flush=True)
    failed: list[str] = []
    for index, bench in enumerate(chosen, 1):
        print(f"[{index}/{len(chosen)}] {bench.name} (~{bench.minutes:g} min)", flush=True)
        start = time.monotonic()
        try:
            run_one(bench, args.quick, results)
            body = render(bench.script, results / f"{bench.name}.json")
            doc = replace_section(args.doc.read_text(), bench.name, body)
        except (BenchmarkFailed, SectionError) as exc:
            print(f"[{index}/{len(chosen)}] {bench.name} FAILED: {exc}", flush=True)
            failed.append(bench.name)
            continue
        args.doc.write_text(doc)
        minutes = (time.monotonic() - start) / 60
        print(f"[{index}/{len(chosen)}] {bench.name} done in {minutes:.1f} min", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)} (their sections were left as they were)")
        return 1
    print(f"{args.doc} rewritten; results in {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
