"""Writes about hospitals' relay users beyond enrolment: suspending one whose hospital
stored more on the relay than its jobs allow, and lifting that suspension.

A Redis ACL cannot bound what a hospital writes under its own keys, so the workers check
it (``workers/relay_guard.py``) and, when a hospital goes beyond its jobs' bounds, suspend
its user: switched off on the relay, its connections dropped, what it stored deleted, its
running turns failed with the reason. The relay keeps serving every other hospital. Only a
consortium admin lifts a suspension; until then the hospital can neither use the relay
nor enrol again.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from hospitals.models import Hospital, RedisCredential
from hospitals.relay_acl import get_provisioner
from kernel.actors import Actor
from kernel.errors import Conflict
from kernel.permissions import require_consortium_admin, require_consortium_admin_on

logger = logging.getLogger(__name__)


@transaction.atomic
def relay_user_suspend(*, actor: Actor, hospital: Hospital, reason: str) -> RedisCredential | None:
    """Suspend ``hospital``'s relay user for ``reason`` (which names the keys and sizes,
    never values). Safe to call twice; a hospital without a live user is left alone.

    Returns:
        The suspended credential, or ``None`` when there was nothing to suspend.

    Raises:
        PermissionDenied: only the system (the workers) and consortium admins suspend.
        RelayProvisioningFailed: the relay could not be reached; nothing was recorded.
    """
    require_consortium_admin(actor, "suspend relay users")
    credential = (
        RedisCredential.objects.select_for_update()
        .filter(hospital=hospital, revoked_at__isnull=True)
        .first()
    )
    if credential is None or credential.suspended_at is not None:
        return credential
    credential.suspended_at = timezone.now()
    credential.suspended_reason = reason[:2000]
    credential.save(update_fields=["suspended_at", "suspended_reason"])
    # Last, so that a relay that cannot be reached leaves nothing recorded.
    deleted = get_provisioner().suspend(username=credential.username, slug=hospital.slug)
    audit_record(
        actor=actor,
        action="relay.user_suspended",
        target=f"relay-user:{credential.username}",
        hospital=hospital.slug,
        details={"reason": credential.suspended_reason, "keys_deleted": deleted},
    )
    logger.warning("relay user of %s suspended: %s", hospital.slug, reason)
    return credential


@transaction.atomic
def relay_user_lift(*, actor: Actor, hospital: Hospital) -> RedisCredential:
    """A consortium admin lifts the suspension of ``hospital``'s relay user: the same user
    and password work again.

    Raises:
        NotFound / PermissionDenied: see kernel/permissions.py.
        Conflict: the hospital's relay user is not suspended.
        RelayProvisioningFailed: the relay could not be reached; it stays suspended.
    """
    require_consortium_admin_on(actor, hospital, "lift relay suspensions")
    credential = (
        RedisCredential.objects.select_for_update()
        .filter(hospital=hospital, revoked_at__isnull=True)
        .first()
    )
    if credential is None or credential.suspended_at is None:
        raise Conflict(f"hospital {hospital.slug!r}'s relay user is not suspended")
    reason = credential.suspended_reason
    credential.suspended_at = None
    credential.suspended_reason = ""
    credential.save(update_fields=["suspended_at", "suspended_reason"])
    get_provisioner().provision(
        username=credential.username, password_sha256=credential.password_sha256, slug=hospital.slug
    )
    audit_record(
        actor=actor,
        action="relay.user_lifted",
        target=f"relay-user:{credential.username}",
        hospital=hospital.slug,
        details={"suspended_for": reason},
    )
    return credential
