"""Reading the audit log, and checking its chain."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.db.models import QuerySet

from audit.chain import CONTENT_FIELDS, GENESIS, content_hash
from audit.filters import AuditEventFilter
from audit.macs import MacKeys, mac_keys
from audit.models import AuditChainHead, AuditEvent
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import InvalidInput, PermissionDenied
from kernel.permissions import require_person_with_role

_VERIFY_CHUNK = 2000


def audit_event_list(
    *, actor: Actor, filters: Mapping[str, Any] | None = None, newest_first: bool = False
) -> QuerySet[AuditEvent]:
    """The events ``actor`` may read, filtered (see :class:`AuditEventFilter`).

    Consortium admins, observers and the system read every event; a hospital admin
    reads the events about their hospital (``hospital`` is its slug).

    Raises:
        PermissionDenied: a hospital's agent, or a person without a role.
        InvalidInput: a filter value is malformed; ``details`` names it.
    """
    events = _readable_events(actor)
    filterset = AuditEventFilter(data=filters or {}, queryset=events)
    if not filterset.is_valid():
        details = {
            field: [str(m) for m in messages] for field, messages in filterset.errors.items()
        }
        raise InvalidInput("the audit log's filters are invalid", details=details)
    return filterset.qs.order_by("-id" if newest_first else "id")


def _readable_events(actor: Actor) -> QuerySet[AuditEvent]:
    if actor.kind == ActorKind.HOSPITAL:
        raise PermissionDenied("hospital agents cannot read the audit log")
    require_person_with_role(actor)
    if _reads_whole_log(actor):
        return AuditEvent.objects.all()
    if actor.role == Role.HOSPITAL_ADMIN and actor.hospital is not None:
        return AuditEvent.objects.filter(hospital=actor.hospital.slug)
    raise PermissionDenied("you may not read the audit log")


def _reads_whole_log(actor: Actor) -> bool:
    return (
        actor.is_system
        or actor.is_consortium_admin
        or (actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER)
    )


class ProblemKind(StrEnum):
    """What can be wrong with the chain, from the first row that does not match."""

    #: The row's stored hash is not the hash of its content: the row was changed.
    CONTENT_HASH_MISMATCH = "content_hash_mismatch"
    #: The row's prev_hash is not the previous row's hash: the previous row was
    #: rewritten along with its hash, or this row's link was changed.
    PREV_HASH_MISMATCH = "prev_hash_mismatch"
    #: Ids jump: the rows in between were removed.
    MISSING_ROWS = "missing_rows"
    #: The head counts more rows than there are: the last rows were removed.
    MISSING_TAIL = "missing_tail"
    #: The head row is gone while events exist.
    HEAD_MISSING = "head_missing"
    #: The head's hash is not the last row's, or rows exist beyond the head.
    HEAD_MISMATCH = "head_mismatch"
    #: The row's MAC does not verify: it was written or rewritten outside the
    #: coordinator, by someone without the MAC key (SQL by the database's owner).
    MAC_MISMATCH = "mac_mismatch"


@dataclass(frozen=True)
class Problem:
    """The first place the chain does not match.

    Attributes:
        row_id: the id (sequence number) of the row that does not match, or of the
            first missing row.
        kind: what is wrong.
        message: what is wrong, for a person.
    """

    row_id: int | None
    kind: ProblemKind
    message: str


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of :func:`audit_verify_chain`.

    Attributes:
        ok: the whole chain verifies.
        checked: rows that matched before the first problem (all rows when ``ok``).
        head_id: the last event's id as the head records it (0 for an empty log).
        head_hash: the last event's hash as the head records it.
        problem: the first problem, when not ``ok``.
    """

    ok: bool
    checked: int
    head_id: int
    head_hash: str
    problem: Problem | None = None


def audit_verify_chain(*, actor: Actor | None = None) -> VerifyResult:
    """Check the whole chain, streaming it in id order, and name the first bad row.

    Each row must have the next id, link to the previous row's hash, and hash to its
    own stored hash; the last row must be the one the head records, and no row may lie
    beyond the head. The head is read first and only rows up to it are checked, so
    appends made while this runs do not count as problems.

    Every row's MAC must verify too (:mod:`audit.macs`), so a row written or rewritten
    with SQL is named even when it is correctly chained and the head was moved with it.

    Note:
        A tail removed together with a head rewound to an older row leaves valid rows and
        MACs; the hospitals witness the head to catch that (:mod:`audit.witness`).

    Args:
        actor: who asks; None for the system (management commands).

    Raises:
        PermissionDenied: ``actor`` is not a consortium admin or an observer.
    """
    if actor is not None:
        if actor.kind == ActorKind.HOSPITAL:
            raise PermissionDenied("hospital agents cannot check the audit chain")
        require_person_with_role(actor)
        if not _reads_whole_log(actor):
            raise PermissionDenied("only consortium admins and observers check the audit chain")

    head = AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON).first()
    head_id, head_hash = (head.last_id, head.last_hash) if head else (0, GENESIS)
    keys = mac_keys()
    rows = AuditEvent.objects.order_by("id").values_list(
        "hash", "mac_key_id", "mac", *CONTENT_FIELDS
    )
    if head is not None:
        rows = rows.filter(id__lte=head_id)

    def result(problem: Problem | None, checked: int) -> VerifyResult:
        return VerifyResult(problem is None, checked, head_id, head_hash, problem)

    expected_id, expected_prev, checked = 1, GENESIS, 0
    for stored_hash, key_id, mac, *values in rows.iterator(chunk_size=_VERIFY_CHUNK):
        content = dict(zip(CONTENT_FIELDS, values, strict=True))
        problem = _row_problem(content, stored_hash, expected_id, expected_prev) or _mac_problem(
            keys, content["id"], stored_hash, key_id, mac
        )
        if problem is not None:
            return result(problem, checked)
        expected_id, expected_prev, checked = expected_id + 1, stored_hash, checked + 1

    last_id = expected_id - 1
    if head is None:
        if last_id:
            return result(
                Problem(None, ProblemKind.HEAD_MISSING, "the chain's head row is missing"), checked
            )
        return result(None, checked)
    if last_id < head_id:
        return result(
            Problem(
                last_id + 1,
                ProblemKind.MISSING_TAIL,
                f"row {last_id + 1} is missing: the head records {head_id} rows and the "
                f"last row found is {last_id}, so {_rows(head_id - last_id)} removed "
                "from the end",
            ),
            checked,
        )
    if head_hash != expected_prev:
        return result(
            Problem(
                last_id,
                ProblemKind.HEAD_MISMATCH,
                f"the head's hash {head_hash} is not the hash of row {last_id} "
                f"({expected_prev}): the last row was replaced",
            ),
            checked,
        )
    beyond = AuditEvent.objects.filter(id__gt=head_id).order_by("id").values_list("id", flat=True)
    first_beyond = beyond.first()
    if first_beyond is not None:
        # Appends that committed meanwhile moved the head too: read it again.
        now = AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON).first()
        if now is None or first_beyond > now.last_id:
            return result(
                Problem(
                    first_beyond,
                    ProblemKind.HEAD_MISMATCH,
                    f"row {first_beyond} lies beyond the chain's head: "
                    "it was added outside audit_record",
                ),
                checked,
            )
    return result(None, checked)


def _row_problem(
    content: dict[str, Any], stored_hash: str, expected_id: int, expected_prev: str
) -> Problem | None:
    row_id = content["id"]
    if row_id != expected_id:
        return Problem(
            expected_id,
            ProblemKind.MISSING_ROWS,
            f"row {expected_id} is missing: the next row found is {row_id}, so "
            f"{_rows(row_id - expected_id)} removed",
        )
    if content["prev_hash"] != expected_prev:
        previous = f"row {row_id - 1}'s hash" if row_id > 1 else "the genesis hash"
        return Problem(
            row_id,
            ProblemKind.PREV_HASH_MISMATCH,
            f"row {row_id}'s prev_hash {content['prev_hash']} is not {previous} "
            f"{expected_prev}: one of the two rows was rewritten",
        )
    try:
        computed = content_hash(content)
    except (TypeError, ValueError) as e:  # only a row changed behind our back gets here
        computed = f"(none: {e})"
    if computed != stored_hash:
        return Problem(
            row_id,
            ProblemKind.CONTENT_HASH_MISMATCH,
            f"row {row_id}'s content hashes to {computed}, not to its stored hash "
            f"{stored_hash}: the row was changed",
        )
    return None


def _mac_problem(
    keys: MacKeys, row_id: int, stored_hash: str, key_id: str, mac: str
) -> Problem | None:
    if keys.verifies(stored_hash, key_id, mac):
        return None
    if key_id and key_id not in keys.keys:
        why = (
            f"it is signed with key {key_id!r}, which this coordinator does not hold: add it "
            "(after the current one) to MEDSPLIT_AUDIT_MAC_KEYS, or the row was forged"
        )
    else:
        why = (
            "its MAC does not verify: it was written or rewritten outside the coordinator "
            "(with SQL, by someone without the MAC key)"
        )
    return Problem(row_id, ProblemKind.MAC_MISMATCH, f"row {row_id}: {why}")


def _rows(count: int) -> str:
    return "1 row was" if count == 1 else f"{count} rows were"
