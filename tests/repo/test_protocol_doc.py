"""``docs/protocol.md`` lists every frame kind of the wire format, and only those: its
"Frame kinds" table must name each :class:`medsplit.wire.FrameKind` value exactly once,
so that the document cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medsplit.wire import FrameKind

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "protocol.md"
HEADING = "### Frame kinds"
COLUMNS = (
    "kind",
    "who sends it",
    "modes",
    "when",
    "tensors",
    "what the receiver does and checks",
)
_KIND_CELL = re.compile(r"`([a-z_]+)`")


class TableError(AssertionError):
    """The "Frame kinds" table is missing or malformed."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def frame_kinds_table(text: str) -> list[dict[str, str]]:
    """The rows of the table under the "Frame kinds" heading, by column name."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == HEADING]
    if len(starts) != 1:
        raise TableError(f"expected one {HEADING!r} heading, found {len(starts)}")
    body = lines[starts[0] + 1 :]
    first = next(
        (i for i, line in enumerate(body) if line.startswith("|") or line.startswith("#")), None
    )
    if first is None or not body[first].startswith("|"):
        raise TableError(f"no table follows {HEADING!r} before the next heading")
    header = tuple(_cells(body[first]))
    if header != COLUMNS:
        raise TableError(f"table columns are {header}, expected {COLUMNS}")
    if first + 1 >= len(body) or set(body[first + 1].replace("|", "").strip()) != {"-"}:
        raise TableError("the table's header is not followed by a |---| separator row")
    rows: list[dict[str, str]] = []
    for line in body[first + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        if len(cells) != len(COLUMNS):
            raise TableError(f"row has {len(cells)} cells, expected {len(COLUMNS)}: {line[:80]}")
        if not all(cells):
            raise TableError(f"row has an empty cell: {line[:80]}")
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def documented_kinds(text: str) -> list[str]:
    """The wire names in the table's first column, in the table's order."""
    names = []
    for row in frame_kinds_table(text):
        match = _KIND_CELL.fullmatch(row["kind"])
        if match is None:
            raise TableError(f"kind cell {row['kind']!r} is not one `wire_name`")
        names.append(match.group(1))
    return names


def test_every_frame_kind_is_documented_and_no_other() -> None:
    names = documented_kinds(DOC.read_text())
    known = {kind.value for kind in FrameKind}
    missing = sorted(known - set(names))
    unknown = sorted(set(names) - known)
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not missing, f"docs/protocol.md's Frame kinds table lacks {missing}"
    assert not unknown, f"docs/protocol.md's Frame kinds table names unknown kinds {unknown}"
    assert not twice, f"docs/protocol.md's Frame kinds table lists {twice} more than once"


def test_each_kind_names_its_sender() -> None:
    for row in frame_kinds_table(DOC.read_text()):
        assert row["who sends it"] in {"hospital, up", "server, down"}, row["kind"]


def test_the_metadata_table_counts_the_kinds() -> None:
    assert f"| `kind` | one of the {len(FrameKind)} kinds in" in DOC.read_text()


_ROW = "| `{}` | hospital, up | vanilla | a | b | c |"
_TABLE = "\n".join([HEADING, "", "| " + " | ".join(COLUMNS) + " |", "|---|---|---|---|---|---|"])


@pytest.mark.parametrize(
    ("rows", "complaint"),
    [
        ([_ROW.format("activations")], None),
        ([_ROW.format("activations"), "| `x` | a | b |"], "cells"),
        (["| `activations` | hospital, up | | a | b | c |"], "empty cell"),
        (["| activations | hospital, up | vanilla | a | b | c |"], "not one"),
    ],
)
def test_the_parser_reads_rows_and_refuses_malformed_ones(
    rows: list[str], complaint: str | None
) -> None:
    text = "\n".join([_TABLE, *rows, "", "### Next", "| a |"])
    if complaint is None:
        assert documented_kinds(text) == ["activations"]
    else:
        with pytest.raises(TableError, match=complaint):
            documented_kinds(text)


def test_the_parser_needs_the_heading_and_the_table() -> None:
    with pytest.raises(TableError, match="heading"):
        frame_kinds_table("no table here")
    with pytest.raises(TableError, match="no table"):
        frame_kinds_table(f"{HEADING}\n\nprose\n\n### Next\n| a |\n")
