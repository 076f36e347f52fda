"""manage.py audit_verify: a report and an exit code."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.platform_apps.audit.support import EVENTS, tamper

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("audit_verify", *args, stdout=out)
    return out.getvalue()


def test_a_sound_chain_is_reported_with_its_head(record_many) -> None:
    events = record_many(3)
    assert f"audit chain verifies: 3 events, head 3 {events[-1].hash}" in run()


def test_json_output(record_many) -> None:
    record_many(2)
    result = json.loads(run("--json"))
    assert (result["ok"], result["checked"], result["problem"]) == (True, 2, None)


def test_a_changed_row_fails_with_exit_code_1_and_is_named(record_many) -> None:
    record_many(5)
    tamper(f"UPDATE {EVENTS} SET target = %s WHERE id = 2", ["hospital:forged"])
    with pytest.raises(CommandError) as failure:
        run()
    assert failure.value.returncode == 1
    assert "row 2: content_hash_mismatch" in str(failure.value)
    assert "1 events matched before it" in str(failure.value)


def test_a_removed_tail_fails_and_is_named(record_many) -> None:
    record_many(5)
    tamper(f"DELETE FROM {EVENTS} WHERE id = 5")
    with pytest.raises(CommandError, match="row 5: missing_tail") as failure:
        run("--json")
    assert failure.value.returncode == 1
