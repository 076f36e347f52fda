"""The audit API: who sees what, filters, exports, the chain check, the schema."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import UTC

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.api.views import FILTER_PARAMETERS
from audit.chain import content_hash
from audit.filters import AuditEventFilter
from audit.models import AuditEvent
from audit.services import audit_record
from hospitals.models import Hospital
from kernel.actors import Actor
from tests.platform_apps.audit.support import EVENTS, tamper
from tests.platform_apps.conftest import agent_actor

pytestmark = pytest.mark.django_db

LIST = "/api/audit/events/"
CSV = "/api/audit/export.csv"
JSONL = "/api/audit/export.jsonl"
VERIFY = "/api/audit/verify/"
EVERY_ENDPOINT = [LIST, CSV, JSONL, VERIFY]
READ_ENDPOINTS = [LIST, CSV, JSONL]


@pytest.fixture
def events(admin_actor: Actor, hospital_a: Hospital, hospital_b: Hospital) -> list[AuditEvent]:
    """1, 4: about st-marys (hospital A); 2: about city-general; 3: about no hospital."""
    return [
        audit_record(
            actor=admin_actor,
            action="hospital.approved",
            target="hospital:st-marys",
            hospital="st-marys",
        ),
        audit_record(
            actor=admin_actor,
            action="hospital.approved",
            target="hospital:city-general",
            hospital="city-general",
        ),
        audit_record(actor=Actor.system(), action="job.started", target="job:7", job_id=7),
        audit_record(
            actor=agent_actor(hospital_a),
            action="turn.finished",
            hospital="st-marys",
            job_id=7,
            details={"bytes_up": 1024, "steps": 3},
        ),
    ]


@pytest.fixture
def as_role(
    request: pytest.FixtureRequest, client_for: Callable[..., APIClient]
) -> Callable[[str], APIClient]:
    """A client signed in as the person of that role (made only when asked for)."""
    fixtures = {
        "consortium_admin": "consortium_admin",
        "observer": "observer",
        "hospital_admin": "hospital_admin",
        "no_role": "no_role_person",
    }
    return lambda role: client_for(request.getfixturevalue(fixtures[role]))


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def ids_in(url: str, response) -> list[int]:
    """The event ids a successful response holds, whatever the endpoint."""
    if url == LIST:
        return [row["id"] for row in response.json()["results"]]
    if url == CSV:
        return [int(row["id"]) for row in csv.DictReader(io.StringIO(body(response)))]
    return [json.loads(line)["id"] for line in body(response).splitlines()]


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    error = response.json()
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == code
    assert error["message"]


# Who sees what.


@pytest.mark.parametrize("url", READ_ENDPOINTS)
@pytest.mark.parametrize("role", ["consortium_admin", "observer"])
def test_admins_and_observers_read_every_event(as_role, events, url: str, role: str) -> None:
    response = as_role(role).get(url)
    assert response.status_code == 200
    expected = [4, 3, 2, 1] if url == LIST else [1, 2, 3, 4]  # the list is newest first
    assert ids_in(url, response) == expected


@pytest.mark.parametrize("url", READ_ENDPOINTS)
def test_a_hospital_admin_reads_only_events_about_their_hospital(as_role, events, url) -> None:
    client = as_role("hospital_admin")
    assert sorted(ids_in(url, client.get(url))) == [1, 4]
    assert ids_in(url, client.get(url, {"hospital": "city-general"})) == []
    assert sorted(ids_in(url, client.get(url, {"job": 7}))) == [4]


@pytest.mark.parametrize("url", EVERY_ENDPOINT)
def test_a_hospital_agent_is_refused(agent_client, hospital_a, events, url: str) -> None:
    assert_error(agent_client(hospital_a).get(url), 403, "permission_denied")


@pytest.mark.parametrize("url", EVERY_ENDPOINT)
def test_a_person_without_a_role_is_refused(as_role, events, url: str) -> None:
    assert_error(as_role("no_role").get(url), 403, "permission_denied")


@pytest.mark.parametrize("url", EVERY_ENDPOINT)
def test_an_anonymous_caller_is_refused(events, url: str) -> None:
    response = APIClient().get(url)
    assert response.status_code in (401, 403)
    assert_error(response, response.status_code, "not_authenticated")


@pytest.mark.parametrize("url", [CSV, JSONL])
def test_export_errors_are_json_whatever_the_client_accepts(as_role, events, url: str) -> None:
    response = as_role("no_role").get(url, HTTP_ACCEPT="text/csv, application/jsonl")
    assert_error(response, 403, "permission_denied")
    assert response["Content-Type"].startswith("application/json")


# Filters.


@pytest.mark.parametrize("url", READ_ENDPOINTS)
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"actor": "person:ada"}, [1, 2]),
        ({"actor": "hospital:st-marys"}, [4]),
        ({"action": "hospital.approved"}, [1, 2]),
        ({"hospital": "city-general"}, [2]),
        ({"job": "7"}, [3, 4]),
        ({"job": "7", "action": "job.started"}, [3]),
        ({"actor": "nobody"}, []),
    ],
)
def test_filters(as_role, events, url: str, query: dict, expected: list[int]) -> None:
    response = as_role("consortium_admin").get(url, query)
    assert response.status_code == 200
    assert sorted(ids_in(url, response)) == expected


@pytest.mark.parametrize("url", READ_ENDPOINTS)
def test_the_time_range_includes_its_start_and_excludes_its_end(as_role, events, url) -> None:
    query = {
        "created_after": events[1].created_at.isoformat(),
        "created_before": events[3].created_at.isoformat(),
    }
    response = as_role("observer").get(url, query)
    assert sorted(ids_in(url, response)) == [2, 3]


@pytest.mark.parametrize("url", READ_ENDPOINTS)
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"job": "seven"}, "job"),
        ({"job": "0"}, "job"),
        ({"job": "1.5"}, "job"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_before": "2026-13-01T00:00:00Z"}, "created_before"),
        ({"action": "a" * 65}, "action"),
        (
            {"created_after": "2026-02-01T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
            "__all__",
        ),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(as_role, events, url: str, query: dict, field) -> None:
    response = as_role("consortium_admin").get(url, query)
    assert_error(response, 400, "invalid")
    assert field in response.json()["details"]


def test_the_list_is_paginated(as_role, events) -> None:
    page = as_role("consortium_admin").get(LIST, {"page_size": 3}).json()
    assert page["count"] == 4
    assert [row["id"] for row in page["results"]] == [4, 3, 2]
    assert page["next"]


# What rows look like: each can be re-hashed by whoever receives it.


def test_listed_rows_carry_everything_their_hash_covers(as_role, events) -> None:
    rows = as_role("observer").get(LIST).json()["results"]
    assert rows[0]["details"] == {"bytes_up": 1024, "steps": 3}
    for row in rows:
        assert content_hash(row) == row["hash"]
        assert row["hash"] == events[row["id"] - 1].hash


def test_jsonl_rows_can_be_re_checked_offline(as_role, events) -> None:
    response = as_role("consortium_admin").get(JSONL)
    assert response.streaming
    assert response["Content-Type"].startswith("application/jsonl")
    rows = [json.loads(line) for line in body(response).splitlines()]
    previous = "0" * 64
    for row in rows:
        assert row["prev_hash"] == previous
        assert content_hash(row) == row["hash"]
        previous = row["hash"]


def test_csv_has_a_header_and_the_recorded_values(as_role, events) -> None:
    response = as_role("consortium_admin").get(CSV, {"job": 7})
    assert response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="audit.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert list(rows[0]) == [
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
        "hash",
    ]
    assert rows[0]["source_ip"] == ""  # the system has no address
    assert rows[1]["details"] == '{"bytes_up":1024,"steps":3}'
    assert rows[1]["hash"] == events[3].hash


@pytest.mark.parametrize("url", [CSV, JSONL])
def test_exports_read_the_rows_while_streaming_not_before(as_role, events, url: str) -> None:
    response = as_role("consortium_admin").get(url)
    assert response.streaming
    with CaptureQueriesContext(connection) as queries:
        content = body(response)
    assert any("audit_auditevent" in q["sql"] for q in queries.captured_queries)
    assert len(content.splitlines()) == (5 if url == CSV else 4)


# The chain check.


@pytest.mark.parametrize("role", ["consortium_admin", "observer"])
def test_admins_and_observers_check_the_chain(as_role, events, role: str) -> None:
    response = as_role(role).get(VERIFY)
    assert response.status_code == 200
    assert response.json() == {
        "ok": True,
        "checked": 4,
        "head_id": 4,
        "head_hash": events[-1].hash,
        "problem": None,
    }


def test_the_check_names_the_first_bad_row(as_role, events) -> None:
    tamper(f"UPDATE {EVENTS} SET hospital = %s WHERE id = 2", ["st-marys"])
    result = as_role("observer").get(VERIFY).json()
    assert (result["ok"], result["checked"]) == (False, 1)
    assert result["problem"]["row_id"] == 2
    assert result["problem"]["kind"] == "content_hash_mismatch"
    assert "row 2" in result["problem"]["message"]


def test_a_hospital_admin_may_not_check_the_whole_chain(as_role, events) -> None:
    assert_error(as_role("hospital_admin").get(VERIFY), 403, "permission_denied")


# The schema.


def test_the_schema_documents_the_routes_and_every_filter(as_role) -> None:
    schema = as_role("observer").get("/api/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    assert {LIST, CSV, JSONL, VERIFY} <= set(paths)
    filters = set(AuditEventFilter.base_filters)
    assert {p.name for p in FILTER_PARAMETERS} == filters
    for url in READ_ENDPOINTS:
        documented = {p["name"] for p in paths[url]["get"]["parameters"]}
        assert filters <= documented, url
    assert {"page", "page_size"} <= {p["name"] for p in paths[LIST]["get"]["parameters"]}
    assert "text/csv" in paths[CSV]["get"]["responses"]["200"]["content"]


def test_the_audit_schema_generates_without_warnings(tmp_path) -> None:
    call_command(
        "spectacular",
        "--urlconf=tests.platform_apps.audit.urls",
        "--validate",
        "--fail-on-warn",
        f"--file={tmp_path / 'schema.yaml'}",
    )
    assert "/api/audit/verify/" in (tmp_path / "schema.yaml").read_text()


def test_times_in_rows_are_utc_with_microseconds(as_role, events) -> None:
    row = as_role("observer").get(LIST).json()["results"][-1]
    expected = events[0].created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert row["created_at"] == expected
