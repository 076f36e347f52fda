"""The audit log as CSV or JSON Lines, produced row by row while it is sent.

Rows come from the database in chunks (``.iterator()``), so an export of any range uses
the same little memory. Every row carries the keys of its canonical content (see
:mod:`audit.chain`) plus its hash, so an exported range can be re-checked offline.

CSV values are written as they are recorded, without the apostrophe some tools prefix to
stop spreadsheet formulas: that would change what the hashes cover. Open exports in a
spreadsheet with that in mind.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

from django.db.models import QuerySet

from audit.chain import CONTENT_FIELDS, canonical_json, format_timestamp
from audit.models import AuditEvent

COLUMNS = (*CONTENT_FIELDS, "hash")
_CHUNK = 1000


def _rows(events: QuerySet[AuditEvent]) -> Iterator[dict[str, Any]]:
    for values in events.values_list(*COLUMNS).iterator(chunk_size=_CHUNK):
        row = dict(zip(COLUMNS, values, strict=True))
        row["created_at"] = format_timestamp(row["created_at"])
        yield row


def jsonl_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """One canonical JSON object per line."""
    for row in _rows(events):
        yield canonical_json(row) + "\n"


class _Line:
    """A file-like object whose ``write`` hands back the line (for csv.writer)."""

    def write(self, text: str) -> str:
        return text


def csv_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """A header, then one line per event; ``details`` as canonical JSON, nulls empty."""
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    for row in _rows(events):
        row["details"] = canonical_json(row["details"])
        yield writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
