"""audit_verify_chain: a chain of appends verifies; a row changed or removed behind the
application's back is detected and named; concurrent appends do not fork the chain."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import DatabaseError, OperationalError, connection, transaction

from audit.chain import content_hash
from audit.models import AuditEvent
from audit.selectors import ProblemKind, audit_verify_chain
from audit.services import audit_record
from kernel.actors import Actor
from tests.platform_apps.audit.support import EVENTS, HEAD, postgresql_only, tamper

N = 40


@pytest.mark.django_db
def test_an_empty_log_verifies() -> None:
    result = audit_verify_chain()
    assert (result.ok, result.checked, result.head_id, result.problem) == (True, 0, 0, None)


@pytest.mark.django_db
def test_a_chain_of_appends_verifies(record_many) -> None:
    events = record_many(N)
    result = audit_verify_chain()
    assert result.ok, result.problem
    assert (result.checked, result.head_id, result.head_hash) == (N, N, events[-1].hash)


def _assert_problem(kind: ProblemKind, row_id: int | None, checked: int) -> str:
    result = audit_verify_chain()
    assert not result.ok
    assert result.problem is not None
    assert (result.problem.kind, result.problem.row_id, result.checked) == (kind, row_id, checked)
    return result.problem.message


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sql", "params"),
    [
        (f"UPDATE {EVENTS} SET action = %s WHERE id = 7", ["forged.action"]),
        (f"UPDATE {EVENTS} SET actor = %s WHERE id = 7", ["person:eve"]),
        (f"UPDATE {EVENTS} SET hospital = %s WHERE id = 7", ["city-general"]),
        (f"UPDATE {EVENTS} SET job_id = %s WHERE id = 7", [99]),
        (f"UPDATE {EVENTS} SET source_ip = NULL WHERE id = 7", []),
        (f"UPDATE {EVENTS} SET details = %s WHERE id = 7", ['{"n": 70}']),
        (f"UPDATE {EVENTS} SET prev_hash = %s WHERE id = 7", ["f" * 64]),
    ],
    ids=["action", "actor", "hospital", "job", "source_ip", "details", "prev_hash_only"],
)
def test_a_changed_row_is_named(record_many, sql: str, params: list) -> None:
    record_many(N)
    tamper(sql, params)
    kind = (
        ProblemKind.PREV_HASH_MISMATCH if "prev_hash" in sql else ProblemKind.CONTENT_HASH_MISMATCH
    )
    assert "row 7" in _assert_problem(kind, 7, 6)


@pytest.mark.django_db
def test_a_timestamp_moved_by_one_microsecond_is_named(record_many) -> None:
    events = record_many(N)
    moved = events[6].created_at + timedelta(microseconds=1)
    tamper(f"UPDATE {EVENTS} SET created_at = %s WHERE id = 7", [moved])
    _assert_problem(ProblemKind.CONTENT_HASH_MISMATCH, 7, 6)


@pytest.mark.django_db
def test_a_row_rewritten_with_a_fresh_hash_is_caught_by_its_mac(record_many) -> None:
    """Before the MACs, this was caught only at the next link (and not at all had every
    later hash been rewritten too: tests/security/test_audit_forgery.py)."""
    events = record_many(N)
    forged = {**events[6].content(), "action": "forged.action"}
    tamper(
        f"UPDATE {EVENTS} SET action = %s, hash = %s WHERE id = 7",
        ["forged.action", content_hash(forged)],
    )
    message = _assert_problem(ProblemKind.MAC_MISMATCH, 7, 6)
    assert "written or rewritten outside the coordinator" in message


@pytest.mark.django_db
@pytest.mark.parametrize(("removed", "named"), [([20], 20), ([1], 1), ([5, 6, 7], 5)])
def test_removed_rows_are_named(record_many, removed: list[int], named: int) -> None:
    record_many(N)
    tamper(f"DELETE FROM {EVENTS} WHERE id IN ({','.join(map(str, removed))})")
    message = _assert_problem(ProblemKind.MISSING_ROWS, named, named - 1)
    assert f"row {named} is missing" in message


@pytest.mark.django_db
@pytest.mark.parametrize("removed", [1, 3])
def test_a_removed_tail_is_named(record_many, removed: int) -> None:
    record_many(N)
    tamper(f"DELETE FROM {EVENTS} WHERE id > %s", [N - removed])
    message = _assert_problem(ProblemKind.MISSING_TAIL, N - removed + 1, N - removed)
    assert f"head records {N} rows" in message


@pytest.mark.django_db
def test_a_removed_head_is_named(record_many) -> None:
    record_many(3)
    tamper(f"DELETE FROM {HEAD}")
    _assert_problem(ProblemKind.HEAD_MISSING, None, 3)


@pytest.mark.django_db
def test_a_replaced_last_row_is_named(record_many) -> None:
    record_many(3)
    tamper(f"UPDATE {HEAD} SET last_hash = %s", ["e" * 64])
    _assert_problem(ProblemKind.HEAD_MISMATCH, 3, 3)


@pytest.mark.django_db
def test_a_row_inserted_beyond_the_head_is_named(record_many) -> None:
    events = record_many(3)
    forged = {**events[-1].content(), "id": 4, "prev_hash": events[-1].hash}
    tamper(
        f"INSERT INTO {EVENTS} (id, created_at, actor_kind, actor, action, target, hospital, "
        "job_id, details, source_ip, prev_hash, hash, mac_key_id, mac) "
        "VALUES (4, %s, 'system', 'system', 'forged', '', '', NULL, '{}', NULL, %s, %s, '', '')",
        [forged["created_at"], events[-1].hash, "d" * 64],
    )
    message = _assert_problem(ProblemKind.HEAD_MISMATCH, 4, 3)
    assert "outside audit_record" in message


@pytest.mark.django_db
@postgresql_only("the triggers are PostgreSQL's; elsewhere the model and the chain guard")
@pytest.mark.parametrize(
    "sql",
    [
        f"UPDATE {EVENTS} SET action = 'forged' WHERE id = 2",
        f"DELETE FROM {EVENTS} WHERE id = 2",
        f"TRUNCATE {EVENTS}",
        f"DELETE FROM {HEAD}",
        f"TRUNCATE {HEAD}",
        f"UPDATE {HEAD} SET last_id = last_id - 1",
        f"UPDATE {HEAD} SET last_hash = repeat('e', 64)",
    ],
)
def test_postgresql_triggers_refuse_changes_from_raw_sql(record_many, sql: str) -> None:
    record_many(3)
    with (
        pytest.raises(DatabaseError, match=r"append-only|only advances"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert audit_verify_chain().ok
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["test.step"] * 3


THREADS, EACH = 8, 25


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_never_fork_the_chain(system_actor: Actor) -> None:
    """On PostgreSQL every append succeeds, in turn. SQLite's in-memory test database
    refuses a writer while another thread writes ("database table is locked"): those
    appends fail and write nothing, and the others still form one chain."""
    start = threading.Barrier(THREADS)
    appended: list[int] = []
    errors: list[BaseException] = []

    def append(worker: int) -> None:
        start.wait()
        for i in range(EACH):
            try:
                event = audit_record(
                    actor=system_actor, action="test.concurrent", details={"w": worker, "i": i}
                )
                appended.append(event.id)
            except Exception as e:  # checked below, in the test's thread
                errors.append(e)
        connection.close()

    threads = [threading.Thread(target=append, args=(w,)) for w in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if connection.vendor == "postgresql":
        assert errors == []
    else:
        assert all(isinstance(e, OperationalError) and "locked" in str(e) for e in errors)
    assert sorted(appended) == list(range(1, len(appended) + 1))
    result = audit_verify_chain()
    assert result.ok, result.problem
    assert result.checked == len(appended) > 0
