"""Attack: whoever owns the coordinator's database forges the audit log.

Before: a correctly chained row inserted with SQL, with the head advanced by one, passed
the PostgreSQL triggers (left on) and ``manage.py audit_verify``; so did history rewritten
from row N on, every later hash and the head with it.

Now every row carries an HMAC of its hash under a key the database does not hold
(``audit/macs.py``), and ``audit_verify`` names the first row whose MAC does not verify.
Runs on the suite's database: PostgreSQL in CI, with its triggers on (the insert needs no
privilege beyond INSERT and the head's advance-by-one UPDATE); SQLite elsewhere.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.chain import GENESIS, content_hash, format_timestamp
from audit.macs import mac_keys
from audit.models import AuditChainHead, AuditEvent
from audit.services import audit_record
from kernel.actors import Actor
from tests.platform_apps.audit.support import EVENTS, HEAD, tamper

pytestmark = pytest.mark.django_db

N = 12


def _verify() -> dict:
    """``manage.py audit_verify --json``, as an operator runs it; its exit status too."""
    out = io.StringIO()
    try:
        call_command("audit_verify", "--json", stdout=out)
        failed = False
    except CommandError as e:
        assert e.returncode == 1
        failed = True
    result = json.loads(out.getvalue())
    assert failed == (not result["ok"])
    return result


def _forged_row(after: AuditEvent, **changes: object) -> dict:
    content = {**after.content(), "id": after.id + 1, "prev_hash": after.hash, **changes}
    content["created_at"] = format_timestamp(after.created_at)
    return {**content, "hash": content_hash(content)}


def _insert(row: dict) -> None:
    """As the database's owner would, with plain SQL; triggers on."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EVENTS} (id, created_at, actor_kind, actor, action, target, "
            "hospital, job_id, details, source_ip, prev_hash, hash, mac_key_id, mac) "
            "VALUES (%s, %s, 'person', 'person:ada', %s, '', '', NULL, '{}', NULL, %s, %s, "
            "%s, %s)",
            # It names the coordinator's current key, but cannot compute the MAC.
            [
                row["id"],
                row["created_at"],
                row["action"],
                row["prev_hash"],
                row["hash"],
                mac_keys().current,
                "0" * 64,
            ],
        )
        # The trigger lets the head advance by exactly one: so it does.
        cursor.execute(
            f"UPDATE {HEAD} SET last_id = %s, last_hash = %s WHERE id = %s",
            [row["id"], row["hash"], AuditChainHead.SINGLETON],
        )


def test_a_correctly_chained_row_inserted_with_sql_is_named() -> None:
    events = [
        audit_record(actor=Actor.system(), action="test.step", details={"n": i}) for i in range(N)
    ]
    assert _verify()["ok"]
    forged = _forged_row(
        events[-1],
        actor_kind="person",
        actor="person:ada",
        action="hospital.approved",
        target="",
        hospital="",
        job_id=None,
        details={},
        source_ip=None,
    )
    _insert(forged)
    result = _verify()
    assert result["problem"]["kind"] == "mac_mismatch"
    assert result["problem"]["row_id"] == N + 1
    assert "written or rewritten outside the coordinator" in result["problem"]["message"]
    assert result["checked"] == N, "every genuine row still verifies"


def test_history_rewritten_from_a_row_on_is_named_at_that_row() -> None:
    events = [
        audit_record(actor=Actor.system(), action="test.step", details={"n": i}) for i in range(N)
    ]
    # The owner rewrites rows 5.. with fresh, correctly chained hashes, and the head too.
    start = 5
    previous = events[start - 2].hash
    for event in events[start - 1 :]:
        content = {**event.content(), "prev_hash": previous, "action": "forged.history"}
        content["created_at"] = format_timestamp(event.created_at)
        new_hash = content_hash(content)
        tamper(
            f"UPDATE {EVENTS} SET action = %s, prev_hash = %s, hash = %s WHERE id = %s",
            ["forged.history", previous, new_hash, event.id],
        )
        previous = new_hash
    tamper(f"UPDATE {HEAD} SET last_hash = %s", [previous])
    result = _verify()
    assert (result["problem"]["kind"], result["problem"]["row_id"]) == ("mac_mismatch", start)
    assert result["checked"] == start - 1


def test_a_row_signed_with_a_retired_key_still_verifies_while_the_key_is_listed(
    settings,
) -> None:
    """Rotation: new rows take the first key; rows of an older key verify while it is
    listed, and are named (with what to do) once it is dropped."""
    old = "old:" + "A" * 43 + "="
    new = "new:" + "B" * 43 + "="
    settings.MEDSPLIT = {**settings.MEDSPLIT, "AUDIT_MAC_KEYS": old}
    audit_record(actor=Actor.system(), action="test.before")
    settings.MEDSPLIT = {**settings.MEDSPLIT, "AUDIT_MAC_KEYS": f"{new},{old}"}
    audit_record(actor=Actor.system(), action="test.after")
    assert list(AuditEvent.objects.values_list("mac_key_id", flat=True)) == ["old", "new"]
    assert _verify()["ok"]
    settings.MEDSPLIT = {**settings.MEDSPLIT, "AUDIT_MAC_KEYS": new}
    result = _verify()
    assert result["problem"]["row_id"] == 1
    assert (
        "add it (after the current one) to MEDSPLIT_AUDIT_MAC_KEYS"
        in (result["problem"]["message"])
    )


def test_the_genesis_is_where_the_chain_starts() -> None:
    first = audit_record(actor=Actor.system(), action="test.step")
    assert first.prev_hash == GENESIS and first.mac_key_id and len(first.mac) == 64
