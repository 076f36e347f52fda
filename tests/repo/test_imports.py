"""The dependency arrows point one way: no import cycle anywhere, between modules or
between packages, and the coordinator's kernel imports no app.

Every import counts, wherever it is written: at the top of a module, inside a function
(a "lazy" import still ties the two modules together) and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ROOT / "platform"
#: Folders whose modules are importable from the repository root, by their path.
ROOTED = ["medsplit", "hospital_agent", "workers"]
#: The coordinator's apps, importable because ``platform/`` is on the path.
APPS = sorted(p.name for p in PLATFORM.iterdir() if p.is_dir() and (p / "__init__.py").exists())
KERNEL = "kernel"


def module_files() -> dict[str, Path]:
    """Every module of the product, by its import name (migrations left out: Django
    loads them by name, and they import only ``django``)."""
    files: dict[str, Path] = {}
    for top in ROOTED:
        for path in sorted((ROOT / top).rglob("*.py")):
            files[_name(path, ROOT)] = path
    for path in sorted(PLATFORM.rglob("*.py")):
        if "migrations" not in path.parts:
            files[_name(path, PLATFORM)] = path
    return files


def _name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules among ``known`` that the module ``name`` (at ``path``) imports."""
    known = set(known)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def resolve(target: str) -> str | None:
        parts = target.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                return candidate
        return None

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # `from package import module` imports that module; `from module import
            # name`, the module that holds the name.
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        else:
            continue
        found.update(r for t in targets if (r := resolve(t)) is not None and r != name)
    return found


def module_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, files) for name, path in files.items()}


def package_of(module: str) -> str:
    """The unit whose arrows are checked at the coarser level: a core subpackage
    (``medsplit.turns``), an agent subpackage, a coordinator app (``training``)."""
    parts = module.split(".")
    if parts[0] in ROOTED:
        return ".".join(parts[:2])
    return parts[0]


def package_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for source, targets in modules.items():
        edges = graph.setdefault(package_of(source), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(source))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm,
    iterative, so a deep graph cannot hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(components: list[list[str]], graph: dict[str, set[str]]) -> str:
    lines = []
    for component in components:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {m} imports {sorted(graph[m] & members)}" for m in component]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def modules() -> dict[str, set[str]]:
    return module_graph(module_files())


def test_no_module_imports_itself_back(modules: dict[str, set[str]]) -> None:
    found = cycles(modules)
    assert not found, "import cycles between modules:\n" + describe(found, modules)


def test_no_package_or_app_imports_itself_back(modules: dict[str, set[str]]) -> None:
    packages = package_graph(modules)
    found = cycles(packages)
    assert not found, "import cycles between packages:\n" + describe(found, packages)


def test_the_kernel_imports_no_app(modules: dict[str, set[str]]) -> None:
    """Every app may import the kernel, so the kernel may import none of them."""
    reaching = {
        m: sorted(t for t in targets if package_of(t) != KERNEL)
        for m, targets in modules.items()
        if package_of(m) == KERNEL
    }
    assert not any(reaching.values()), {m: t for m, t in reaching.items() if t}


def test_apps_do_not_import_the_project(modules: dict[str, set[str]]) -> None:
    """``coordinator/`` is the project (settings, URLs): it sits above every app."""
    up = {
        m: sorted(t for t in targets if package_of(t) == "coordinator")
        for m, targets in modules.items()
        if package_of(m) in set(APPS) - {"coordinator"}
    }
    assert not any(up.values()), {m: t for m, t in up.items() if t}


def test_the_walk_sees_every_part(modules: dict[str, set[str]]) -> None:
    """The graph holds what it should: a check over an empty graph would always pass."""
    tops = {m.split(".")[0] for m in modules}
    assert {"medsplit", "hospital_agent", "workers", KERNEL, "training", "accounts"} <= tops
    assert "medsplit.turns.client" in modules
    assert "medsplit.training.config" in modules["medsplit.turns.client"]
    assert "kernel.actors" in modules["training.services"]


def test_a_cycle_is_found_however_it_is_written(tmp_path: Path) -> None:
    """A lazy import inside a function and one under TYPE_CHECKING both close a cycle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    (pkg / "c.py").write_text("from . import a\n")
    files = {_name(p, tmp_path): p for p in pkg.rglob("*.py")}
    graph = module_graph(files)
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
