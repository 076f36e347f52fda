"""What a hospital's agent sees of the audit chain, and what it says when the chain changed
behind it (``audit.witness`` says why hospitals witness the chain).

The agent reads the chain's links (ids and hashes only) and, when a head it witnessed is
gone, sends a statement signed with its identity key. The report is kept, with whether its
signature verified against the hospital's pinned identity key, and raised on the dashboard.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import transaction

from audit.services import audit_record
from audit.witness import Head, Link, audit_head, chain_links, witness_report_record
from hospitals.models import Hospital
from kernel.actors import Actor
from kernel.errors import InvalidInput
from kernel.permissions import require_agent
from medsplit.errors import SealError
from medsplit.protocol.keys import identity_public_from_b64
from medsplit.protocol.statements import verify_statement

logger = logging.getLogger(__name__)

#: The purpose an agent signs its witness statements for.
PURPOSE = "audit-witness"


def agent_chain_links(*, actor: Actor, after: int, limit: int) -> tuple[list[Link], Head]:
    """The chain's links after ``after`` and the head, for a hospital's agent."""
    require_agent(actor, "read the audit chain's links")
    return chain_links(actor=actor, after=after, limit=limit), audit_head()


@transaction.atomic
def agent_witness_report(*, actor: Actor, statement: str, signature: str) -> bool:
    """Keep an agent's signed report that a head it witnessed is gone from the chain.

    Returns:
        Whether the signature verified against the hospital's pinned identity key (the
        report is kept either way: a hospital saying the chain was rewritten is news).

    Raises:
        PermissionDenied: not an agent.
        InvalidInput: not a witness statement of this hospital.
    """
    require_agent(actor, "report on the audit chain")
    hospital: Hospital = actor.hospital
    fields = _fields(statement)
    if fields["hospital"] != hospital.slug:
        raise InvalidInput(
            "the statement is another hospital's", details={"hospital": ["not yours"]}
        )
    verified = False
    if hospital.identity_key:
        try:
            verify_statement(
                identity_public_from_b64(hospital.identity_key), PURPOSE, statement, signature
            )
            verified = True
        except SealError as e:
            logger.warning("witness report of %s does not verify: %s", hospital.slug, e)
    witnessed = Head(int(fields["witnessed"]["seq"]), str(fields["witnessed"]["hash"]))
    report = witness_report_record(
        hospital=hospital.slug,
        witnessed=witnessed,
        found=str(fields["found"]),
        message=str(fields["message"]),
        signed=statement,
        signature=signature,
        verified=verified,
    )
    audit_record(
        actor=actor,
        action="audit.witness_mismatch",
        target=f"audit-head:{witnessed.seq}",
        hospital=hospital.slug,
        details={"report": report.pk, "verified": verified, "found": report.found},
    )
    logger.error("hospital %s reports the audit chain changed: %s", hospital.slug, report.message)
    return verified


def _fields(statement: str) -> dict[str, Any]:
    try:
        fields = json.loads(statement)
        witnessed = fields["witnessed"]
        ok = (
            isinstance(fields, dict)
            and isinstance(fields.get("hospital"), str)
            and isinstance(witnessed.get("seq"), int)
            and isinstance(witnessed.get("hash"), str)
            and isinstance(fields.get("found"), str)
            and isinstance(fields.get("message"), str)
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise InvalidInput(
            "not a witness statement: a JSON object with hospital, witnessed {seq, hash}, "
            "found and message",
            details={"statement": ["malformed"]},
        )
    return fields
