"""What exactly an audit row's hash covers, and how it is computed.

Canonical content of a row (format version 1)
---------------------------------------------

The SHA-256 (lowercase hex) of the UTF-8 bytes of one JSON object with exactly these
keys::

    v           1 (this format's version)
    id          the row's sequence number: 1, 2, 3, ... without gaps
    prev_hash   the previous row's hash; 64 zeros ("genesis") for row 1
    created_at  "YYYY-MM-DDTHH:MM:SS.ffffffZ": UTC, always six digits of microseconds
    actor_kind  "person" | "hospital" | "system"
    actor       e.g. "person:ada", "hospital:st-marys", "system"
    action      e.g. "hospital.approved"
    target      string, "" when none
    hospital    the slug of the hospital the event concerns, "" when none
    job_id      integer or null
    details     JSON object (see below)
    source_ip   string or null

written the way ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` writes it: keys sorted by code point at every
depth, no whitespace, non-ASCII characters as themselves (UTF-8), no NaN or Infinity.
Numbers: integers as integers; a float with an integral value is written as that
integer (``1.0`` -> ``1``, ``-0.0`` -> ``0``, ``1e20`` -> ``100000000000000000000``),
because PostgreSQL's ``jsonb`` does not keep the difference; other floats in Python's
shortest round-trip form (``0.1``, ``1.5e-10``). Lists keep their order.

The API and the exports return every row with exactly these keys plus ``hash`` (and no
``v``), with ``created_at`` in the same format, so anyone can re-check a row offline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from audit.errors import AuditError

FORMAT_VERSION = 1
GENESIS = "0" * 64
MAX_DETAILS_BYTES = 16 * 1024
MAX_DETAILS_DEPTH = 16
#: How the canonical content (and every view of a row) writes a timestamp.
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

#: The keys of the canonical content, besides ``v``, in the order the exports use.
CONTENT_FIELDS = (
    "id",
    "prev_hash",
    "created_at",
    "actor_kind",
    "actor",
    "action",
    "target",
    "hospital",
    "job_id",
    "details",
    "source_ip",
)


def format_timestamp(moment: datetime) -> str:
    """``moment`` as the canonical content writes it: UTC, microseconds, ``Z``."""
    if moment.tzinfo is None:
        raise AuditError("audit timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime(TIMESTAMP_FORMAT)


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON text (see the module's docstring).

    Raises:
        ValueError: ``value`` holds NaN or an infinity.
        TypeError: ``value`` holds something JSON has no form for.
    """
    return json.dumps(
        _integral_floats_as_ints(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def content_hash(content: Mapping[str, Any]) -> str:
    """The hash of a row whose fields are ``content`` (the keys of
    :data:`CONTENT_FIELDS`, ``created_at`` as a datetime or already formatted)."""
    fields = {name: content[name] for name in CONTENT_FIELDS}
    if isinstance(fields["created_at"], datetime):
        fields["created_at"] = format_timestamp(fields["created_at"])
    fields["v"] = FORMAT_VERSION
    return hashlib.sha256(canonical_json(fields).encode("utf-8")).hexdigest()


def clean_details(details: Mapping[str, Any] | None) -> dict[str, Any]:
    """``details`` as it will be stored and hashed: plain JSON, at most 16 KiB.

    Accepts mappings with string keys, lists and tuples, strings, integers, finite
    floats, booleans and None; integral floats become integers (see above).

    Raises:
        AuditError: anything else (sets, bytes, dates, arrays, objects), NaN or
            infinities, NUL characters, nesting deeper than 16, or more than 16 KiB
            of canonical JSON. The message names the offending path.
    """
    if details is None:
        return {}
    if not isinstance(details, Mapping):
        raise AuditError(f"audit details must be a mapping, not {type(details).__name__}")
    cleaned = _clean(details, "details", 0)
    try:
        size = len(canonical_json(cleaned).encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate: not text PostgreSQL can store
        raise AuditError(f"audit details hold a string that is not valid Unicode: {e}") from e
    if size > MAX_DETAILS_BYTES:
        raise AuditError(
            f"audit details are {size} bytes of JSON, more than the {MAX_DETAILS_BYTES} "
            "allowed: record sizes and identifiers, never data"
        )
    return cleaned


def _clean(value: Any, path: str, depth: int) -> Any:
    if depth > MAX_DETAILS_DEPTH:
        raise AuditError(f"audit details nest deeper than {MAX_DETAILS_DEPTH} at {path}")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise AuditError(f"audit details hold {value!r} at {path}: JSON has no such number")
        return int(value) if value.is_integer() else value
    if isinstance(value, str):
        if "\x00" in value:
            raise AuditError(f"audit details hold a NUL character at {path}")
        return value
    if isinstance(value, Mapping):
        cleaned = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise AuditError(f"audit details have a {type(key).__name__} key at {path}")
            if "\x00" in key:
                raise AuditError(f"audit details have a key with a NUL character at {path}")
            cleaned[key] = _clean(item, f"{path}.{key}", depth + 1)
        return cleaned
    if isinstance(value, list | tuple):
        return [_clean(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise AuditError(
        f"audit details hold a {type(value).__name__} at {path}: only JSON values "
        "(objects, arrays, strings, numbers, booleans, null) can be recorded"
    )


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value
