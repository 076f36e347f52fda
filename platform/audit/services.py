"""Writing to the audit log: the one way rows are added."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.chain import GENESIS, clean_details, content_hash
from audit.errors import AuditError, ChainHeadMissing
from audit.macs import mac_keys
from audit.models import AuditChainHead, AuditEvent
from kernel.actors import Actor

__all__ = ["GENESIS", "audit_record"]

_MAX_LENGTHS = {"action": 64, "target": 200, "hospital": 64, "actor": 200}
_MAX_JOB_ID = 2**63 - 1


def audit_record(
    *,
    actor: Actor,
    action: str,
    target: str = "",
    hospital: str = "",
    job_id: int | None = None,
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event (``action`` like ``hospital.approved``) to the audit log.

    The row is written in the caller's transaction, if there is one: it is kept if and
    only if what it records is. It holds the chain's lock (:class:`AuditChainHead`)
    until that transaction ends, which serialises every audited write of the
    coordinator, so call it last in your transaction, after your own row locks (that
    keeps the lock short and the lock order the same everywhere).

    Args:
        actor: who did it.
        action: dotted name of what happened (at most 64 characters).
        target: what it happened to, e.g. ``hospital:st-marys`` or ``job:12``.
        hospital: slug of the hospital the event concerns, for per-hospital views.
        job_id: the job the event concerns, if any.
        details: plain JSON facts (sizes, states, counts), at most 16 KiB; never
            patient data, never values of tensors.

    Returns:
        The saved event, with its ``id`` (sequence number) and ``hash``.

    Raises:
        AuditError: an argument cannot be recorded (see :func:`audit.chain.clean_details`);
            nothing was written.
        ChainHeadMissing: the chain's head row was removed behind the application's back.
    """
    fields = {
        "actor_kind": actor.kind.value,
        "actor": _checked_text("actor", actor.label),
        "action": _checked_text("action", action),
        "target": _checked_text("target", target),
        "hospital": _checked_text("hospital", hospital),
        "job_id": _checked_job_id(job_id),
        "details": clean_details(details),
        "source_ip": _checked_ip(actor.source_ip),
    }
    if not fields["action"]:
        raise AuditError("an audit event needs an action")
    keys = mac_keys()
    with transaction.atomic():
        last_id, last_hash = _lock_head()
        event = AuditEvent(
            id=last_id + 1,
            prev_hash=last_hash,
            # Taken under the lock, so timestamps never go down along the chain
            # (unless the clock does).
            created_at=timezone.now(),
            **fields,
        )
        event.hash = content_hash(event.content())
        event.mac_key_id = keys.current
        event.mac = keys.mac(event.hash)
        _insert_and_advance(event)
    return event


# Every audited write of the coordinator goes through the two functions below while
# holding the chain's lock, so they speak SQL directly: through the ORM, building the
# statements cost almost as much as running them (bench/bench_audit.py).


def _lock_head() -> tuple[int, str]:
    """The head's last id and hash, locked until the transaction ends (made on the
    first append)."""
    quote = connection.ops.quote_name
    sql = f"SELECT last_id, last_hash FROM {quote(AuditChainHead._meta.db_table)} WHERE id = %s"
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(sql, [AuditChainHead.SINGLETON])
        row = cursor.fetchone()
    if row is not None:
        return row[0], row[1]
    # Two first appends may race here: the loser's insert waits for the winner's
    # transaction, fails on the primary key, and get_or_create then reads (and locks)
    # the winner's head.
    head, created = AuditChainHead.objects.select_for_update().get_or_create(
        pk=AuditChainHead.SINGLETON
    )
    # Only now, holding the head we made, can "no head but events" mean tampering:
    # before, it may have been a first append committing meanwhile.
    if created and AuditEvent.objects.exists():
        raise ChainHeadMissing(
            "the audit chain's head row is missing while events exist; run "
            "`manage.py audit_verify` and investigate before recording anything else"
        )
    return head.last_id, head.last_hash


def _insert_and_advance(event: AuditEvent) -> None:
    """Insert ``event`` (every column, as its field prepares it) and move the head to it:
    in one statement on PostgreSQL (one round trip fewer under the lock), two elsewhere."""
    quote = connection.ops.quote_name
    fields = AuditEvent._meta.concrete_fields
    insert = (
        f"INSERT INTO {quote(AuditEvent._meta.db_table)} "
        f"({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    values = [f.get_db_prep_save(getattr(event, f.attname), connection) for f in fields]
    head = quote(AuditChainHead._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH event AS ({insert} RETURNING id, hash) UPDATE {head} "
                "SET last_id = event.id, last_hash = event.hash FROM event "
                f"WHERE {head}.id = %s",
                [*values, AuditChainHead.SINGLETON],
            )
        else:
            cursor.execute(insert, values)
            cursor.execute(
                f"UPDATE {head} SET last_id = %s, last_hash = %s WHERE id = %s",
                [event.id, event.hash, AuditChainHead.SINGLETON],
            )
        if cursor.rowcount != 1:  # the head row vanished under the lock
            raise ChainHeadMissing("the audit chain's head row disappeared during an append")
    event._state.adding = False
    event._state.db = connection.alias


def _checked_text(name: str, value: str) -> str:
    if not isinstance(value, str):
        raise AuditError(f"audit {name} must be a string, not {type(value).__name__}")
    if len(value) > _MAX_LENGTHS[name]:
        raise AuditError(f"audit {name} is longer than {_MAX_LENGTHS[name]} characters")
    if "\x00" in value:
        raise AuditError(f"audit {name} holds a NUL character")
    return value


def _checked_job_id(job_id: int | None) -> int | None:
    if job_id is None:
        return None
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 <= job_id <= _MAX_JOB_ID:
        raise AuditError(f"audit job_id must be a non-negative 64-bit integer, not {job_id!r}")
    return job_id


def _checked_ip(source_ip: str | None) -> str | None:
    """The address in the form the database gives it back (so the hash still matches)."""
    if not source_ip:
        return None
    try:
        address = ipaddress.ip_address(source_ip)
    except ValueError:
        raise AuditError(f"audit source_ip {source_ip!r} is not an IP address") from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise AuditError(f"audit source_ip {source_ip!r} has a zone, which cannot be stored")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    return str(address)
