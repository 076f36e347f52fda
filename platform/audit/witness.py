"""The hospitals witness the audit chain, so that its own database's owner cannot rewrite it.

The MACs (:mod:`audit.macs`) stop a row written with SQL by someone without the key. They
cannot stop someone who holds the key too (who runs the coordinator, say), or a tail
deleted together with the head rewound to an older row. The hospitals can, because the
coordinator's operators do not control them:

- every heartbeat answer carries the chain's head (:func:`audit_head`);
- each agent keeps the heads it was shown, and now and then asks for the chain's links
  from its oldest kept head to now (:func:`chain_links`: ids and hashes, never content)
  and checks, itself, that every head it witnessed is still in the chain;
- a mismatch is reported back, signed with the agent's identity key, and kept here
  (:class:`audit.models.WitnessReport`): the dashboard raises it, and no operator can make
  the hospitals forget what they saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from audit.chain import GENESIS
from audit.models import AuditChainHead, AuditEvent, WitnessReport
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import InvalidInput, PermissionDenied

#: At most this many links in one answer; an agent asks again from where it got to.
MAX_LINKS = 5000


@dataclass(frozen=True)
class Head:
    """The chain's tip: the last event's sequence number and hash (0 and genesis when empty)."""

    seq: int
    hash: str


@dataclass(frozen=True)
class Link:
    """One row of the chain, as a witness needs it: where it is and what it chains to."""

    seq: int
    prev_hash: str
    hash: str


def audit_head() -> Head:
    """The chain's head as it stands."""
    row = AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON).first()
    return Head(row.last_id, row.last_hash) if row else Head(0, GENESIS)


def chain_links(*, actor: Actor, after: int, limit: int = MAX_LINKS) -> list[Link]:
    """The chain's links after sequence number ``after`` (up to the head), oldest first.

    Hospitals' agents and people who read the whole log may ask: ids and hashes say
    nothing about what the rows record.

    Raises:
        PermissionDenied: a person without the right to read the whole log.
        InvalidInput: ``after`` or ``limit`` out of range.
    """
    if actor.kind != ActorKind.HOSPITAL and not (
        actor.is_system
        or actor.is_consortium_admin
        or (actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER)
    ):
        raise PermissionDenied("only hospitals' agents and readers of the whole log see the chain")
    if not isinstance(after, int) or after < 0:
        raise InvalidInput("after must be a sequence number >= 0", details={"after": [after]})
    if not 1 <= limit <= MAX_LINKS:
        raise InvalidInput(f"limit must be 1..{MAX_LINKS}", details={"limit": [limit]})
    head = audit_head()
    rows = (
        AuditEvent.objects.filter(id__gt=after, id__lte=head.seq)
        .order_by("id")
        .values_list("id", "prev_hash", "hash")[:limit]
    )
    return [Link(seq, prev, own) for seq, prev, own in rows]


def witness_report_record(
    *,
    hospital: str,
    witnessed: Head,
    found: str,
    message: str,
    signed: str,
    signature: str,
    verified: bool,
) -> WitnessReport:
    """Keep a hospital's report that a head it witnessed is no longer in the chain.

    ``signed`` is the canonical text the agent signed and ``signature`` its signature;
    ``verified``, whether it verified against the hospital's pinned identity key (the
    caller, in the hospitals app, checks it). Kept outside the chain on purpose: a report
    that the chain was rewritten must not depend on the chain.
    """
    return WitnessReport.objects.create(
        hospital=hospital,
        received_at=timezone.now(),
        witnessed_seq=witnessed.seq,
        witnessed_hash=witnessed.hash,
        found=found[:200],
        message=message[:2000],
        signed=signed[:8000],
        signature=signature[:16000],
        verified=verified,
    )


def witness_reports(*, actor: Actor) -> list[WitnessReport]:
    """Every report, newest first, for consortium admins and observers; a hospital admin
    sees those of their own hospital."""
    reports = WitnessReport.objects.order_by("-received_at", "-pk")
    if actor.is_system or actor.is_consortium_admin:
        return list(reports)
    if actor.kind == ActorKind.PERSON and actor.role == Role.OBSERVER:
        return list(reports)
    if actor.kind == ActorKind.PERSON and actor.role == Role.HOSPITAL_ADMIN and actor.hospital:
        return list(reports.filter(hospital=actor.hospital.slug))
    raise PermissionDenied("only people with a role see the hospitals' witness reports")
