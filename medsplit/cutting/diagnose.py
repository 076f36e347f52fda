"""Say where and why tracing or exporting a model stopped: the module, the line, the kind."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stop:
    """Where a tracer stopped, read off its exception.

    Attributes:
        module: qualified name of the innermost submodule running (``""``: the model's
            own ``forward``), or ``None`` when it cannot be told.
        module_type: that module's class name.
        location: ``file:line`` of the statement in that module's code.
        kind: the kind of construct, in words.
        data_dependent: whether the construct depends on tensor values (no static cut
            can follow it).
        detail: the tracer's own first line.
    """

    module: str | None
    module_type: str
    location: str
    kind: str
    data_dependent: bool
    detail: str

    def describe(self) -> str:
        """``"in module 'a.b' (Block), at file.py:12, on len() of a traced value (...)"``."""
        return f"{self.where()}, on {self.kind} ({self.detail})"

    def where(self) -> str:
        """``"in module 'a.b' (Block), at file.py:12"``."""
        if self.module is None and self.location == "?":
            where = "outside the model's modules"
        elif self.module is None:
            where = f"in a module of class {self.module_type}, at {self.location}"
        elif self.module:
            where = f"in module {self.module!r} ({self.module_type}), at {self.location}"
        else:
            where = f"in {self.module_type}.forward, at {self.location}"
        return where


# (substring of the message, kind, depends on tensor values): the first match wins.
_KINDS = (
    (
        "cannot be used as inputs to control flow",
        "a data-dependent branch or loop (on a tensor's value)",
        True,
    ),
    ("data-dependent", "a branch or size that depends on a tensor's value", True),
    ("could not guard on", "a branch or size that depends on a tensor's value", True),
    ("'len' is not supported", "len() of a traced value (say len(x.shape))", False),
    ("cannot be iterated", "iteration over a traced value (say list(t.chunk(2, 1)))", False),
    ("__array", "a traced value turned into a NumPy array (say np.array(x.shape))", False),
    ("__bool__", "a traced value used as a truth value", False),
    ("Proxy(", "a traced value used as a dict key, an index or a Python number", False),
)


def diagnose(error: BaseException, model: torch.nn.Module) -> Stop:
    """Find, in ``error``'s traceback, the innermost frame running one of ``model``'s
    modules, and classify what stopped the tracer by its message."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    found = None
    for exc in chain:
        found = _innermost_module(exc, model)
        if found is not None:
            break
    module, module_type, location = found or (None, type(model).__name__, "?")
    messages = " ".join(str(e) for e in chain)
    kind, data_dependent = "a Python construct the tracer cannot record", False
    for needle, name, dependent in _KINDS:
        if needle.lower() in messages.lower():
            kind, data_dependent = name, dependent
            break
    return Stop(module, module_type, location, kind, data_dependent, _first_line(error))


def _innermost_module(
    error: BaseException, model: torch.nn.Module
) -> tuple[str | None, str, str] | None:
    """``(qualified name, class name, file:line)`` of the innermost module running; the
    name is ``None`` where it cannot be told.

    Export runs copies of the submodules, so modules are named by walking down the
    frames from the model's own ``forward``, each one looked up inside the one before,
    by identity or else by a class its parent holds only once.
    """
    frames = []
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
            frames.append((owner, where))
        tb = tb.tb_next
    roots = [i for i, (owner, _) in enumerate(frames) if isinstance(owner, type(model))]
    if not roots:
        return None
    path: list[str] | None = []
    parent, location = frames[roots[0]]
    kind = type(parent).__name__
    for owner, where in frames[roots[0] + 1 :]:
        location, kind = where, type(owner).__name__
        if owner is parent or path is None:
            parent = owner
            continue
        name = _child_name(parent, owner)
        path = None if name is None else [*path, name]
        parent = owner
    return (None if path is None else ".".join(path)), kind, location


def _child_name(parent: torch.nn.Module, child: torch.nn.Module) -> str | None:
    same = [n for n, m in parent.named_modules() if n and m is child]
    if same:
        return same[0]
    alike = [
        n for n, m in parent.named_children() if type(m).__qualname__ == type(child).__qualname__
    ]
    return alike[0] if len(alike) == 1 else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."
