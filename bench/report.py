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


#: How redis-py talks RESP, by name: (reply parser, command packer). ``pure Python`` is
#: redis-py without hiredis; ``hiredis`` is hiredis' parser with redis-py's packer, as
#: ``RedisChannel`` sets it up; ``hiredis + its packer`` is what redis-py picks by itself
#: when hiredis is installed (its packer copies every argument, see ``RedisChannel``).
RESP_VARIANTS = ("pure Python", "hiredis", "hiredis + its packer")


def use_resp(client: Any, variant: str) -> None:
    """Make the redis-py ``client`` (a ``redis.Redis``) parse and pack with ``variant``
    (one of :data:`RESP_VARIANTS`) from its next connection on; connections it holds are
    dropped. For benchmarks: both sides of a comparison in the same process."""
    from redis.connection import Encoder, PythonRespSerializer, _HiredisParser, _RESP2Parser
    from redis.utils import HIREDIS_AVAILABLE

    if variant not in RESP_VARIANTS:
        raise ValueError(f"unknown RESP variant {variant!r}; one of {RESP_VARIANTS}")
    if variant != "pure Python" and not HIREDIS_AVAILABLE:
        raise RuntimeError(f"{variant!r} needs hiredis>=3.2 installed (pip install hiredis)")
    python_packer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    kwargs = client.connection_pool.connection_kwargs
    # _RESP2Parser is redis-py's Python parser; with protocol 3 it takes _RESP3Parser.
    kwargs["parser_class"] = _RESP2Parser if variant == "pure Python" else _HiredisParser
    kwargs["command_packer"] = None if variant == "hiredis + its packer" else python_packer
    # A connection keeps the parser it was made with: drop them, new ones take the above.
    client.connection_pool.disconnect()
    client.connection_pool.reset()
