"""Which cuts the cut table lists: module boundaries, as deep as the crossings change.

A cut after a module in a plain chain sends one tensor, as the cut after its parent
does: listing it adds a row, not a choice. A module is therefore opened (its children
listed) when some cut inside it sends a different number of tensors than the cut after
it: a skip connection spans the inside (UNet's encoder and decoder, DenseNet's dense
layers). Modules at the top level are always opened, as the depth-2 table always was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import fx

from medsplit.cutting.trace import module_path_stack
from medsplit.errors import CutError

#: Most rows a default table lists; deeper cuts are left out, with a note saying so.
MAX_ROWS = 200
#: Deepest a table may be asked for (a submodule name with this many parts).
MAX_DEPTH = 16


@dataclass(frozen=True)
class Candidates:
    """Cut names in forward order, and a note when the listing stopped short."""

    names: list[str]
    note: str | None = None


def module_ends(gm: fx.GraphModule) -> dict[str, int]:
    """Each module's qualified name (in order of first appearance) and the index of the
    last graph node that runs inside it."""
    last: dict[str, int] = {}
    for index, node in enumerate(gm.graph.nodes):
        for path in module_path_stack(node):
            if path:
                last[path] = index
    return last


def crossing_counts(gm: fx.GraphModule, sent: Callable[[fx.Node], bool]) -> list[int]:
    """For each node index ``p``, how many values ``sent`` accepts are made at or before
    ``p`` and used after it: what a cut there would send."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    delta = [0] * (len(nodes) + 1)
    for i, node in enumerate(nodes):
        if node.op == "get_attr" or not node.users or not sent(node):
            continue
        end = max(index[u] for u in node.users)
        if end > i:
            delta[i] += 1
            delta[end] -= 1
    counts, running = [], 0
    for d in delta[:-1]:
        running += d
        counts.append(running)
    return counts


def choose(
    gm: fx.GraphModule,
    *,
    depth: int | None,
    sent: Callable[[fx.Node], bool] = lambda _: True,
    limit: int = MAX_ROWS,
) -> Candidates:
    """The cuts to list: every module at most ``depth`` deep, or, with ``depth=None``,
    the modules opened as the module docstring says, at most ``limit`` of them.

    Raises:
        CutError: ``depth`` is out of range.
    """
    # bool is an int: True as a depth is a bug, not a 1.
    whole = isinstance(depth, int) and not isinstance(depth, bool)
    if depth is not None and (not whole or not 1 <= depth <= MAX_DEPTH):
        raise CutError(f"depth must be an integer from 1 to {MAX_DEPTH}, got {depth!r}")
    ends = module_ends(gm)
    if depth is not None:
        return Candidates(_by_position([p for p in ends if p.count(".") < depth], ends))
    counts = crossing_counts(gm, sent)
    children: dict[str, list[str]] = {"": []}
    for path in ends:
        children.setdefault(_parent(path, ends), []).append(path)
        children.setdefault(path, [])
    # Per module, the crossing counts of every cut inside it.
    inside: dict[str, set[int]] = {p: set() for p in ends}
    for path in sorted(ends, key=lambda p: -p.count(".")):
        parent = _parent(path, ends)
        if parent:
            inside[parent] |= inside[path] | {counts[ends[path]]}
    listed: list[str] = []
    level = children[""]
    note = None
    while level:
        if len(_by_position(listed + level, ends)) > limit:
            deeper = len(level)
            note = (
                f"the table stops at {len(listed)} cuts; {deeper} more lie deeper "
                "(ask for a depth, `medsplit cuts --depth N`, to see them)"
            )
            break
        listed += level
        level = [
            child
            for path in level
            if not _parent(path, ends) or inside[path] - {counts[ends[path]]}
            for child in children[path]
        ]
    return Candidates(_by_position(listed, ends), note)


def _parent(path: str, ends: dict[str, int]) -> str:
    """The nearest enclosing module that runs ("" for a top-level one)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in ends:
            return prefix
    return ""


def _by_position(names: list[str], ends: dict[str, int]) -> list[str]:
    """One name per cut position (the shallowest names it most plainly), in forward order."""
    by_position: dict[int, str] = {}
    for name in names:
        position = ends[name]
        current = by_position.get(position)
        if current is None or name.count(".") < current.count("."):
            by_position[position] = name
    return [by_position[p] for p in sorted(by_position)]
