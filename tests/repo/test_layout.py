"""The repository's own rules (DESIGN.md): folders, dependency arrows, no pickle, CI = README."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = [
    "medsplit",
    "platform",
    "workers",
    "hospital_agent",
    "frontend",
    "tests",
    "bench",
    "docs",
]
NO_FRAMEWORKS = ["medsplit", "hospital_agent"]
READS_OTHER_PARTIES = ["medsplit", "hospital_agent", "workers"]


def python_files(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder", TOP_LEVEL)
def test_design_folders_exist(folder: str) -> None:
    assert (ROOT / folder).is_dir()


def _platform_module_of(command: list[str], *, cwd: Path, env: dict[str, str]) -> Path:
    """The folder of the ``platform`` module that ``command`` (which prints its
    ``__file__`` last) imported."""
    out = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(out.splitlines()[-1]).resolve().parent


STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
PRINT_PLATFORM = "import platform; print(platform.__file__); platform.machine()"


@pytest.mark.parametrize("cwd", [".", "platform", "medsplit", "tests"])
def test_import_platform_gives_the_standard_library(cwd: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")])}
    command = [sys.executable, "-c", PRINT_PLATFORM]
    assert _platform_module_of(command, cwd=ROOT / cwd, env=env) == STDLIB


def test_manage_py_sits_at_the_root_only() -> None:
    """DESIGN.md's top level: ``manage.py`` at the root, no second copy in ``platform/``."""
    assert (ROOT / "manage.py").is_file()
    assert os.access(ROOT / "manage.py", os.X_OK)
    assert sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("platform/**/manage.py")) == []


def test_the_coordinator_process_still_has_the_standard_library_platform(tmp_path: Path) -> None:
    """``manage.py`` puts ``platform/`` on the path and runs Django; inside that process
    ``import platform`` is still the standard library's module."""
    env = {**os.environ, "MEDSPLIT_DATA_DIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    command = [
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        f"import coordinator.settings; {PRINT_PLATFORM}",
    ]
    assert _platform_module_of(command, cwd=ROOT, env=env) == STDLIB


def test_platform_folder_is_not_a_package() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_nothing_in_the_tree_could_be_imported_as_platform() -> None:
    """A `platform/__init__.py` or `platform.py` anywhere would shadow the standard library
    for code run from its parent folder (a `tests/platform/` package did, once)."""
    skip = {".venv", "node_modules", ".git"}
    found = [
        str(p.relative_to(ROOT))
        for pattern in ("**/platform/__init__.py", "**/platform.py")
        for p in ROOT.glob(pattern)
        if not skip & set(p.relative_to(ROOT).parts)
    ]
    assert not found, found


@pytest.mark.parametrize("path", python_files(*NO_FRAMEWORKS), ids=str)
def test_core_and_agent_never_import_django_or_celery(path: Path) -> None:
    banned = {"django", "celery", "rest_framework"}
    found = {m for m in imported_modules(path) if m.split(".")[0] in banned}
    assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def _unsafe_loads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            hits += [f"imports {m}" for m in modules if m and m.split(".")[0] in {"pickle", "dill"}]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = ast.unparse(node.func)
            if target in {"torch.load", "pickle.load", "pickle.loads"}:
                hits.append(f"calls {target}")
            if node.func.attr == "load" and any(
                kw.arg == "allow_pickle"
                and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
                for kw in node.keywords
            ):
                hits.append("loads with allow_pickle")
    return hits


@pytest.mark.parametrize("path", python_files(*READS_OTHER_PARTIES), ids=str)
def test_no_pickle_or_torch_load_where_bytes_from_others_are_read(path: Path) -> None:
    """Invariant 5: no code execution from the wire."""
    assert not _unsafe_loads(path), f"{path.relative_to(ROOT)}: {_unsafe_loads(path)}"


def test_the_scan_would_find_an_unsafe_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch, numpy as np\ntorch.load(b)\nnp.load(f, allow_pickle=True)\n")
    assert _unsafe_loads(bad) == ["calls torch.load", "loads with allow_pickle"]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_readme_test_command_exactly() -> None:
    blocks = readme_commands()
    assert len(blocks) >= 2, "README needs its two set-up commands in shell code blocks"
    test_command = blocks[1].strip()
    ci_lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert test_command in ci_lines
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
    assert os.access(ROOT / "scripts" / "test", os.X_OK)


def test_the_test_command_lints() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    assert "ruff check ." in script and "ruff format --check ." in script
