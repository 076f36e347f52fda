"""Markdown for ``docs/benchmarks.md``: tables, and the marked sections that
``bench/run_all.py`` rewrites.

Each benchmark script prints one JSON object with ``--json`` and defines
``markdown(result) -> str``, the tables of its section. In ``docs/benchmarks.md`` a
section's generated part sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
(NAME is the script's name without ``.py``); the prose around the markers is written by
hand and kept.

Imported by name (``from report import ...``), like ``platform_setup``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any


class SectionError(ValueError):
    """The document lacks a benchmark's markers, or has them more than once."""


def begin_marker(name: str) -> str:
    return f"<!-- bench:{name} -->"


def end_marker(name: str) -> str:
    return f"<!-- /bench:{name} -->"


def today() -> str:
    """The date a figure was measured, as the tables show it (UTC)."""
    return dt.datetime.now(dt.UTC).date().isoformat()


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command a result was measured with, as its section quotes it (without
    ``--json``, which changes only how it is printed)."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join([f".venv/bin/python bench/{script}", *(a for a in given if a != "--json")])


def environment() -> dict[str, Any]:
    """What a result was measured on: Python, torch and its threads, the CPUs, the machine."""
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)),
        "machine": platform.machine(),
    }


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table; cells are written with ``str``."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [str(cell).replace("|", "\\|") for cell in row]
        if len(cells) != len(headers):
            raise ValueError(f"row has {len(cells)} cells for {len(headers)} columns: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sections(text: str) -> list[str]:
    """The names of the marked sections in ``text``, in order."""
    return re.findall(r"<!-- bench:([\w.-]+) -->", text)


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the part between ``name``'s markers replaced by ``body``."""
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SectionError(
            f"docs/benchmarks.md must hold {begin} and {end} exactly once each "
            f"(found {text.count(begin)} and {text.count(end)})"
        )
    start = text.index(begin) + len(begin)
    stop = text.index(end)
    if stop < start:
        raise SectionError(f"{end} comes before {begin}")
    return text[:start] + "\n" + body.strip("\n") + "\n" + text[stop:]
