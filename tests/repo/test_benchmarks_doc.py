"""``bench/run_all.py`` rewrites the tables of ``docs/benchmarks.md``: every benchmark it
runs has a marked section and a ``markdown`` renderer, and a real (quick) run replaces
its own section and nothing else."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
DOC = REPO / "docs" / "benchmarks.md"

sys.path.insert(0, str(BENCH))
import report  # noqa: E402
import run_all  # noqa: E402


def test_every_benchmark_has_one_section_and_a_renderer() -> None:
    doc = DOC.read_text()
    names = [b.name for b in run_all.BENCHMARKS]
    assert report.sections(doc) == names, "sections must be in run_all's order, once each"
    for bench in run_all.BENCHMARKS:
        tree = ast.parse((BENCH / f"{bench.script}.py").read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"markdown", "main"} <= functions, f"{bench.script}.py lacks markdown() or main()"
        assert doc.count(report.end_marker(bench.name)) == 1


def test_every_benchmark_script_is_run_by_run_all() -> None:
    scripts = {p.stem for p in BENCH.glob("bench_*.py")}
    assert scripts == {b.script for b in run_all.BENCHMARKS}


def test_splitguard_rows_come_from_bench_hijack_with_its_method() -> None:
    # One script, two sections: SplitOut's with the defaults, SplitGuard's with its own.
    benches = run_all.by_name()
    splitout, splitguard = benches["bench_hijack"], benches["bench_hijack_splitguard"]
    assert splitout.script == splitguard.script == "bench_hijack"
    for args in (splitguard.args, splitguard.quick):
        assert args[args.index("--method") + 1] == "splitguard"
    assert "--method" not in splitout.args + splitout.quick
    sys.path.insert(0, str(BENCH))
    import bench_hijack

    assert bench_hijack.main.__module__ == "bench_hijack"  # importable, as render() does


def test_replace_section_keeps_the_prose_around_it() -> None:
    text = "# T\n\nprose before\n<!-- bench:x -->\nold\n<!-- /bench:x -->\nprose after\n"
    new = report.replace_section(text, "x", "| a |\n|---|\n| 1 |\n")
    assert new == (
        "# T\n\nprose before\n<!-- bench:x -->\n| a |\n|---|\n| 1 |\n<!-- /bench:x -->\n"
        "prose after\n"
    )
    assert report.replace_section(new, "x", "old") == text


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("no markers", "exactly once"),
        ("<!-- bench:x -->\n<!-- /bench:x -->\n<!-- bench:x -->", "exactly once"),
        ("<!-- /bench:x -->\n<!-- bench:x -->", "comes before"),
    ],
)
def test_replace_section_refuses_bad_markers(text: str, complaint: str) -> None:
    with pytest.raises(report.SectionError, match=complaint):
        report.replace_section(text, "x", "body")


def test_table_refuses_a_row_of_the_wrong_width() -> None:
    assert report.table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    with pytest.raises(ValueError, match="1 cells for 2 columns"):
        report.table(["a", "b"], [[1]])


def _run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_quick_run_rewrites_its_own_section_only(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    original = DOC.read_text()
    doc.write_text(original)
    results = tmp_path / "results"
    done = _run_all(
        "--only", "bench_frames", "--quick", "--doc", str(doc), "--results", str(results)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((results / "bench_frames.json").read_text())
    assert {"overhead", "throughput"} <= result.keys()
    rewritten = doc.read_text()
    begin, end = report.begin_marker("bench_frames"), report.end_marker("bench_frames")
    # Outside the section nothing changed; inside it is exactly the renderer's output.
    assert rewritten.split(begin)[0] == original.split(begin)[0]
    assert rewritten.split(end)[1] == original.split(end)[1]
    sys.path.insert(0, str(BENCH))
    import bench_frames

    inside = rewritten.split(begin)[1].split(end)[0]
    assert inside.strip("\n") == bench_frames.markdown(result).strip("\n")
    assert f"{result['overhead'][-1]['frame_bytes']:,}" in inside


def test_unknown_names_and_missing_sections_are_refused(tmp_path: Path) -> None:
    done = _run_all("--only", "bench_nothing")
    assert done.returncode == 2 and "no benchmark named 'bench_nothing'" in done.stderr
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# nothing marked\n")
    done = _run_all("--only", "bench_relay", "--doc", str(doc))
    assert done.returncode == 1 and "no marked section for: bench_relay" in done.stderr
    assert doc.read_text() == "# nothing marked\n"
