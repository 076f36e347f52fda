"""A party's pseudonymous patient identifiers, read from its own files and checked.

Identifiers are what the private set intersection compares, byte for byte, so they are
held to one strict form: 1 to :data:`MAX_IDENTIFIER_LENGTH` characters of printable ASCII
without spaces (``!`` to ``~``). Anything else is refused rather than normalised: two
hospitals writing one patient's pseudonym differently (a trailing space, another Unicode
form) would silently drop that patient from the intersection.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from medsplit.psi.errors import IdentifierError

__all__ = [
    "MAX_IDENTIFIERS",
    "MAX_IDENTIFIER_LENGTH",
    "check_identifiers",
    "identifiers_from_csv",
    "identifiers_from_files",
    "load_identifiers",
]

MAX_IDENTIFIERS = 2_000_000
"""The most identifiers one party may bring (memory and time of one PSI run stay bounded)."""

MAX_IDENTIFIER_LENGTH = 128
"""The longest identifier, in characters (pseudonyms and hashes fit; a whole record does not)."""

_ALLOWED = frozenset(chr(c) for c in range(0x21, 0x7F))


def load_identifiers(
    source: str | Path, *, column: str | None = None, pattern: str = "*"
) -> tuple[str, ...]:
    """The identifiers of ``source``: a CSV file's ``column``, or the names of the files in
    a folder (each name up to its first ``.``), in the source's order.

    Raises:
        IdentifierError: the source is missing, or an identifier is empty, malformed or
            repeated, or there are none or more than :data:`MAX_IDENTIFIERS`.
    """
    path = Path(source)
    if path.is_dir():
        if column is not None:
            raise IdentifierError(
                f"{path} is a folder: its identifiers are its file names, not a column {column!r}",
                source=str(path),
            )
        return identifiers_from_files(path, pattern=pattern)
    if column is None:
        raise IdentifierError(
            f"{path}: name the CSV column that holds the identifiers", source=str(path)
        )
    return identifiers_from_csv(path, column)


def identifiers_from_csv(path: str | Path, column: str) -> tuple[str, ...]:
    """The identifiers in ``column`` of the CSV file ``path`` (which has a header row)."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise IdentifierError(f"{path}: no such file", source=source)
    values: list[tuple[str, int]] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise IdentifierError(f"{path}: the file is empty", source=source, line=1)
            if header.count(column) != 1:
                found = "twice" if header.count(column) > 1 else "not"
                raise IdentifierError(
                    f"{path}, line 1: column {column!r} is {found} in the header {header[:10]}",
                    source=source,
                    line=1,
                )
            index = header.index(column)
            for row in reader:
                line = reader.line_num
                if not row:
                    continue  # a blank line holds no record
                if len(row) != len(header):
                    raise IdentifierError(
                        f"{path}, line {line}: {len(row)} fields where the header has "
                        f"{len(header)}",
                        source=source,
                        line=line,
                    )
                values.append((row[index], line))
                if len(values) > MAX_IDENTIFIERS:
                    raise _too_many(source, line)
        except UnicodeDecodeError as exc:
            raise IdentifierError(
                f"{path}, line {reader.line_num + 1}: not UTF-8 text ({exc.reason})",
                source=source,
                line=reader.line_num + 1,
            ) from exc
        except csv.Error as exc:
            raise IdentifierError(
                f"{path}, line {reader.line_num}: not valid CSV ({exc})",
                source=source,
                line=reader.line_num,
            ) from exc
    return _checked(values, source, unit="line")


def identifiers_from_files(folder: str | Path, *, pattern: str = "*") -> tuple[str, ...]:
    """The identifiers of the files in ``folder`` matching ``pattern``: each file's name up
    to its first ``.`` (``P0012.png`` and ``P0012.nii.gz`` are ``P0012``), by sorted name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IdentifierError(f"{folder}: no such folder", source=str(folder))
    files = sorted(p.name for p in folder.glob(pattern) if p.is_file())
    if len(files) > MAX_IDENTIFIERS:
        raise _too_many(str(folder), len(files))
    values = [(name.split(".", 1)[0], number) for number, name in enumerate(files, 1)]
    return _checked(values, str(folder), unit="file", names=files)


def check_identifiers(values: Iterable[str], *, source: str = "identifiers") -> tuple[str, ...]:
    """``values`` as a tuple, checked like a file's (``source`` names them in errors)."""
    numbered: list[tuple[str, int]] = []
    for number, value in enumerate(values, 1):
        numbered.append((value, number))
        if len(numbered) > MAX_IDENTIFIERS:
            raise _too_many(source, number)
    return _checked(numbered, source, unit="item")


def _checked(
    values: list[tuple[str, int]], source: str, *, unit: str, names: list[str] | None = None
) -> tuple[str, ...]:
    if not values:
        raise IdentifierError(f"{source}: no identifiers", source=source)
    first_seen: dict[str, int] = {}
    for value, number in values:
        where = f"{source}, {unit} {number}" + (f" ({names[number - 1]})" if names else "")
        problem = _malformed(value)
        if problem:
            raise IdentifierError(f"{where}: {problem}", source=source, line=number)
        if value in first_seen:
            raise IdentifierError(
                f"{where}: identifier {value!r} repeats {unit} {first_seen[value]}; each "
                "record needs its own identifier",
                source=source,
                line=number,
            )
        first_seen[value] = number
    return tuple(value for value, _ in values)


def _malformed(value: object) -> str:
    """What is wrong with ``value`` as an identifier, or ``""``."""
    if not isinstance(value, str):
        return f"identifier is a {type(value).__name__}, not text"
    if not value:
        return "empty identifier"
    if len(value) > MAX_IDENTIFIER_LENGTH:
        return f"identifier of {len(value)} characters (at most {MAX_IDENTIFIER_LENGTH})"
    bad = next((c for c in value if c not in _ALLOWED), None)
    if bad is not None:
        return (
            f"identifier {value[:40]!r} holds {bad!r}: only printable ASCII without spaces "
            "(! to ~) is allowed"
        )
    return ""


def _too_many(source: str, number: int) -> IdentifierError:
    return IdentifierError(
        f"{source}: more than {MAX_IDENTIFIERS:,} identifiers", source=source, line=number
    )
