"""Outside ``medsplit/modes/`` no module names a particular mode: callers hold a mode and
call its hooks (docs/design.md, "Modes"). Prose may name modes; code may not, neither by a
string equal to a mode's name nor by importing a mode's own module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from medsplit.modes import MODES

ROOT = Path(__file__).resolve().parents[2]
PYTHON_TREES = ("medsplit", "platform", "workers", "hospital_agent", "scripts")
SCRIPT_TREES = ("frontend/src",)


def _excluded(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith("medsplit/modes/") or "/migrations/" in rel


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
    return ids


def _python_problems(path: Path, names: set[str], label: str | None = None) -> list[str]:
    label = label or str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in prose:
            found.append(f"{label}:{node.lineno}: the string {node.value!r}")
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] == ["medsplit", "modes"] and len(parts) > 2 and parts[2] in names:
                found.append(f"{label}:{node.lineno}: imports {node.module}")
    return found


def test_no_module_outside_the_modes_names_a_mode() -> None:
    names = set(MODES)
    assert {"vanilla", "ushaped"} <= names
    problems: list[str] = []
    for tree in PYTHON_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if not _excluded(path):
                problems += _python_problems(path, names)
    alternatives = "|".join(sorted(names))
    quoted = re.compile(rf"""['"`]({alternatives})['"`]""")
    for tree in SCRIPT_TREES:
        for path in sorted((ROOT / tree).rglob("*.js")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if quoted.search(line) and not line.lstrip().startswith("//"):
                    problems.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not problems, "a mode named outside medsplit/modes/:\n" + "\n".join(problems)


def test_the_check_finds_a_mode_named_in_code(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""vanilla in prose is fine."""\n'
        "from medsplit.modes.ushaped import UShapedMode\n"
        "MODE = 'vanilla'\n"
    )
    problems = _python_problems(sample, set(MODES), label="sample.py")
    assert problems == [
        "sample.py:2: imports medsplit.modes.ushaped",
        "sample.py:3: the string 'vanilla'",
    ]
