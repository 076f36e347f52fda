"""Helpers of the audit tests: changing rows behind the application's back, and letting
Django's test flush past the PostgreSQL triggers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from django.db.backends.postgresql.operations import DatabaseOperations

from audit.models import AuditChainHead, AuditEvent

EVENTS = AuditEvent._meta.db_table
HEAD = AuditChainHead._meta.db_table


def postgresql_only(why: str) -> pytest.MarkDecorator:
    """Skip on other databases, saying ``why`` (run with DATABASE_URL=postgres://...)."""
    return pytest.mark.skipif(
        connection.vendor != "postgresql", reason=f"PostgreSQL only: {why} (set DATABASE_URL)"
    )


def tamper(sql: str, params: Sequence[Any] = ()) -> None:
    """Run ``sql`` the way someone with database access would, past the model and, on
    PostgreSQL, with the audit triggers off (as only the tables' owner can do)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER USER")
            cursor.execute(f"ALTER TABLE {HEAD} DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER USER")
            cursor.execute(f"ALTER TABLE {HEAD} ENABLE TRIGGER USER")


@contextmanager
def flush_past_audit_triggers() -> Iterator[None]:
    """Django's transactional tests end with a flush: one TRUNCATE of every table, which
    the audit triggers refuse. While this is active, a flush that truncates the audit
    tables turns their triggers off for its own transaction (the test database's owner
    may), and back on before it commits."""
    original = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        tables = [self.quote_name(t) for t in (EVENTS, HEAD)]
        if not any(t in sql for sql in sql_list for t in tables):
            return original(self, sql_list)
        off = [f"ALTER TABLE {t} DISABLE TRIGGER USER" for t in tables]
        on = [f"ALTER TABLE {t} ENABLE TRIGGER USER" for t in tables]
        return original(self, [*off, *sql_list, *on])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "execute_sql_flush", execute_sql_flush)
        yield
