"""The canonical content and its hash (no database)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.chain import (
    GENESIS,
    MAX_DETAILS_BYTES,
    canonical_json,
    clean_details,
    content_hash,
    format_timestamp,
)
from audit.errors import AuditError

SAMPLE = {
    "id": 3,
    "prev_hash": "ab" * 32,
    "created_at": datetime(2026, 11, 30, 9, 26, 0, 5, tzinfo=UTC),
    "actor_kind": "person",
    "actor": "person:ada",
    "action": "hospital.approved",
    "target": "hospital:st-marys",
    "hospital": "st-marys",
    "job_id": None,
    "details": {"zeta": [1, 2.5], "alpha": "Zürich"},
    "source_ip": "127.0.0.1",
}

# Written out by hand from the definition in audit.chain's docstring.
SAMPLE_CANONICAL = (
    '{"action":"hospital.approved","actor":"person:ada","actor_kind":"person",'
    '"created_at":"2026-11-30T09:26:00.000005Z","details":{"alpha":"Zürich","zeta":[1,2.5]},'
    '"hospital":"st-marys","id":3,"job_id":null,'
    f'"prev_hash":"{"ab" * 32}","source_ip":"127.0.0.1","target":"hospital:st-marys","v":1}}'
)


def test_the_hash_is_sha256_of_the_documented_canonical_bytes() -> None:
    expected = hashlib.sha256(SAMPLE_CANONICAL.encode("utf-8")).hexdigest()
    assert content_hash(SAMPLE) == expected


def test_every_field_is_covered_by_the_hash() -> None:
    changed = {
        "id": 4,
        "prev_hash": GENESIS,
        "created_at": SAMPLE["created_at"] + timedelta(microseconds=1),
        "actor_kind": "system",
        "actor": "person:eve",
        "action": "hospital.rejected",
        "target": "hospital:city-general",
        "hospital": "city-general",
        "job_id": 1,
        "details": {"zeta": [1, 2.5], "alpha": "Zurich"},
        "source_ip": "127.0.0.2",
    }
    for field, value in changed.items():
        assert content_hash({**SAMPLE, field: value}) != content_hash(SAMPLE), field


def test_timestamps_are_utc_with_microseconds() -> None:
    paris = timezone(timedelta(hours=1))
    assert format_timestamp(datetime(2026, 1, 1, 1, 0, tzinfo=paris)) == (
        "2026-01-01T00:00:00.000000Z"
    )
    with pytest.raises(AuditError, match="timezone-aware"):
        format_timestamp(datetime(2026, 1, 1))


def test_integral_floats_are_written_as_integers() -> None:
    assert canonical_json({"a": 1.0, "b": -0.0, "c": 1e20, "d": 0.1, "e": [2.0]}) == (
        '{"a":1,"b":0,"c":100000000000000000000,"d":0.1,"e":[2]}'
    )
    with pytest.raises(ValueError):
        canonical_json({"a": float("nan")})


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ({"ids": {1, 2}}, "set at details.ids"),
        ({"raw": b"\x00"}, "bytes at details.raw"),
        ({"when": datetime(2026, 1, 1)}, "datetime at details.when"),
        ({"obj": object()}, "object at details.obj"),
        ({"loss": float("nan")}, "nan"),
        ({"loss": float("inf")}, "inf"),
        ({1: "a"}, "int key"),
        ({"a": "x\x00y"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"s": "\ud800"}, "not valid Unicode"),
        ([("a", 1)], "must be a mapping"),
    ],
)
def test_details_that_are_not_plain_json_are_refused(details: object, message: str) -> None:
    with pytest.raises(AuditError, match=message):
        clean_details(details)  # type: ignore[arg-type]


def test_details_nested_too_deep_are_refused() -> None:
    deep: dict = {}
    node = deep
    for _ in range(20):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(AuditError, match="deeper than 16"):
        clean_details(deep)


def test_details_are_capped_at_16_kib_of_canonical_json() -> None:
    overhead = len(canonical_json({"pad": ""}))
    at_limit = {"pad": "a" * (MAX_DETAILS_BYTES - overhead)}
    assert len(canonical_json(at_limit).encode()) == MAX_DETAILS_BYTES
    assert clean_details(at_limit) == at_limit
    # Counted in UTF-8 bytes, not characters.
    over = {"pad": "é" * ((MAX_DETAILS_BYTES - overhead) // 2 + 1)}
    with pytest.raises(AuditError, match="more than the 16384 allowed"):
        clean_details(over)


def test_clean_details_turns_tuples_into_lists_and_keeps_the_rest() -> None:
    assert clean_details(None) == {}
    assert clean_details({"a": (1, 2.0), "b": {"c": None, "d": True}}) == {
        "a": [1, 2],
        "b": {"c": None, "d": True},
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=4).filter(lambda k: "\x00" not in k), children, max_size=4
        )
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=4).filter(lambda k: "\x00" not in k), json_values))
def test_cleaned_details_survive_a_json_round_trip_unchanged(details: dict) -> None:
    """What the database hands back (parsed JSON) hashes like what was recorded."""
    cleaned = clean_details(details)
    text = canonical_json(cleaned)
    assert canonical_json(json.loads(text)) == text
    assert clean_details(cleaned) == cleaned
