"""Writes about hospitals: registering, joining, approving, enrolling agents, tokens,
relay users and heartbeats.

Every service checks its actor itself (accounts/permissions.py), runs in one
transaction and writes its audit rows in it. Services that change a hospital lock its
row first (``select_for_update``), so approval, enrolment, rotation and revocation of
one hospital happen one at a time and always take locks in the same order (hospital,
then its codes or tokens).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from secrets import token_urlsafe
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from audit.services import audit_record
from hospitals.authentication import TOKEN_PREFIX
from hospitals.errors import (
    EnrolmentCodeExpired,
    EnrolmentCodeRevoked,
    EnrolmentCodeUnknown,
    EnrolmentCodeUsed,
)
from hospitals.keys import IdentityKey, parse_identity_key
from hospitals.models import (
    SLUG_PATTERN,
    AgentToken,
    EnrolmentCode,
    Hospital,
    RedisCredential,
)
from hospitals.relay_acl import get_provisioner, relay_key_pattern, relay_username
from kernel import secrets
from kernel.actors import Actor, ActorKind
from kernel.errors import Conflict, InvalidInput, NotFound, PlatformError
from kernel.permissions import (
    require_agent,
    require_consortium_admin,
    require_consortium_admin_on,
    require_manages_hospital,
)
from medsplit.channel.keys import RESERVED_WORDS

CODE_PREFIX = "msc"
#: Names a hospital may not take: URL words of the API, and every word of the relay's
#: key layout (medsplit.channel.keys), so that no slug can be read as another part of a key.
RESERVED_SLUGS = frozenset({"join-requests"}) | RESERVED_WORDS
_RELAY_PASSWORD_BYTES = 32


@dataclass(frozen=True)
class IssuedCode:
    """A fresh enrolment code: show ``plaintext`` once."""

    plaintext: str
    key_id: str
    expires_at: datetime


@dataclass(frozen=True)
class IssuedToken:
    """A fresh agent token: show ``plaintext`` once."""

    plaintext: str
    key_id: str


@dataclass(frozen=True)
class RelayCredentials:
    """How an agent reaches the relay; ``password`` is shown once."""

    url: str
    username: str
    password: str
    key_pattern: str


@dataclass(frozen=True)
class Registration:
    hospital: Hospital
    enrolment_code: IssuedCode | None


@dataclass(frozen=True)
class Enrolment:
    hospital: Hospital
    token: IssuedToken
    relay: RelayCredentials


@dataclass(frozen=True)
class Revocation:
    hospital: Hospital
    tokens_revoked: int
    codes_revoked: int
    relay_user_revoked: bool


def _target(hospital: Hospital) -> str:
    return f"hospital:{hospital.slug}"


def _locked(hospital: Hospital) -> Hospital:
    """``hospital`` fresh from the database, its row locked until the transaction ends."""
    return Hospital.objects.select_for_update().get(pk=hospital.pk)


# -- registering and joining ----------------------------------------------------------


def _new_hospital(*, name: str, slug: str | None, contact_email: str, status: str) -> Hospital:
    name = name.strip()
    slug = slug if slug is not None else slugify(name)[:64].strip("-")
    errors: dict[str, list[str]] = {}
    if not name:
        errors["name"] = ["a hospital needs a name"]
    elif Hospital.objects.filter(name__iexact=name).exists():
        errors["name"] = ["a hospital with this name exists"]
    if slug in RESERVED_SLUGS:
        errors["slug"] = [f"{slug!r} is reserved; choose another"]
    elif not re.fullmatch(SLUG_PATTERN, slug):
        errors["slug"] = [
            "lower-case letters, digits and inner hyphens, at most 64 characters"
            + ("" if slug else " (none could be made from the name: give one)")
        ]
    elif Hospital.objects.filter(slug=slug).exists():
        errors["slug"] = ["a hospital with this slug exists"]
    if errors:
        raise InvalidInput("the hospital could not be registered", details=errors)
    try:
        with transaction.atomic():
            return Hospital.objects.create(
                name=name, slug=slug, contact_email=contact_email, status=status
            )
    except IntegrityError:  # a concurrent registration took the name or slug
        raise InvalidInput(
            "the hospital could not be registered",
            details={"name": ["a hospital with this name or slug exists"]},
        ) from None


@transaction.atomic
def hospital_register(
    *,
    actor: Actor,
    name: str,
    slug: str | None = None,
    contact_email: str = "",
    approve: bool = True,
) -> Registration:
    """A consortium admin registers a hospital, approved at once (with an enrolment code
    to hand to its agent) or left as requested.

    Raises:
        PermissionDenied: the actor is not a consortium admin.
        InvalidInput: a taken name or slug, or a slug that cannot be used.
    """
    require_consortium_admin(actor, "register hospitals")
    status = Hospital.Status.APPROVED if approve else Hospital.Status.REQUESTED
    hospital = _new_hospital(name=name, slug=slug, contact_email=contact_email, status=status)
    audit_record(
        actor=actor,
        action="hospital.registered",
        target=_target(hospital),
        hospital=hospital.slug,
        details={"name": hospital.name, "status": hospital.status},
    )
    code = None
    if approve:
        hospital.approved_at = timezone.now()
        hospital.save(update_fields=["approved_at"])
        code = _issue_code(actor=actor, hospital=hospital)
    return Registration(hospital=hospital, enrolment_code=code)


@transaction.atomic
def hospital_join_request(
    *, name: str, contact_email: str, slug: str | None = None, source_ip: str | None = None
) -> Hospital:
    """A hospital asks to join (no account needed); an admin approves or rejects it.

    Raises:
        InvalidInput: a taken name or slug, or a slug that cannot be used.
    """
    hospital = _new_hospital(
        name=name, slug=slug, contact_email=contact_email, status=Hospital.Status.REQUESTED
    )
    audit_record(
        actor=Actor.anonymous(source_ip),
        action="hospital.join_requested",
        target=_target(hospital),
        hospital=hospital.slug,
        details={"name": hospital.name, "contact_email": contact_email},
    )
    return hospital


# -- approving, rejecting, enrolment codes --------------------------------------------


def _revoke_unused_codes(hospital: Hospital, now: datetime) -> int:
    return EnrolmentCode.objects.filter(
        hospital=hospital, used_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=now)


def _issue_code(*, actor: Actor, hospital: Hospital) -> IssuedCode:
    now = timezone.now()
    replaced = _revoke_unused_codes(hospital, now)
    issued = secrets.issue(CODE_PREFIX)
    ttl = timedelta(seconds=settings.MEDSPLIT["ENROLMENT_CODE_TTL_SECONDS"])
    code = EnrolmentCode.objects.create(
        hospital=hospital, key_id=issued.key_id, digest=issued.digest, expires_at=now + ttl
    )
    audit_record(
        actor=actor,
        action="enrolment_code.issued",
        target=_target(hospital),
        hospital=hospital.slug,
        details={
            "key_id": code.key_id,
            "expires_at": code.expires_at.isoformat(),
            "revoked_unused_codes": replaced,
        },
    )
    return IssuedCode(plaintext=issued.plaintext, key_id=code.key_id, expires_at=code.expires_at)


@transaction.atomic
def hospital_approve(*, actor: Actor, hospital: Hospital) -> Registration:
    """A consortium admin approves a requested (or earlier rejected) hospital; the answer
    holds its first enrolment code.

    Raises:
        NotFound / PermissionDenied: see accounts/permissions.py.
        Conflict: the hospital is not waiting for approval.
    """
    require_consortium_admin_on(actor, hospital, "approve hospitals")
    hospital = _locked(hospital)
    allowed = (Hospital.Status.REQUESTED, Hospital.Status.REJECTED)
    if hospital.status not in allowed:
        raise Conflict(
            f"hospital {hospital.slug!r} is {hospital.status}; only a requested or rejected "
            "hospital can be approved (issue a fresh enrolment code instead)",
            details={"status": hospital.status},
        )
    hospital.status = Hospital.Status.APPROVED
    hospital.approved_at = timezone.now()
    hospital.save(update_fields=["status", "approved_at"])
    audit_record(
        actor=actor, action="hospital.approved", target=_target(hospital), hospital=hospital.slug
    )
    return Registration(
        hospital=hospital, enrolment_code=_issue_code(actor=actor, hospital=hospital)
    )


@transaction.atomic
def hospital_reject(*, actor: Actor, hospital: Hospital, reason: str = "") -> Hospital:
    """A consortium admin rejects a requested or approved (not yet enrolled) hospital;
    its unused enrolment codes stop working.

    Raises:
        NotFound / PermissionDenied: see accounts/permissions.py.
        Conflict: the hospital has an agent already (revoke its tokens instead), or was
            rejected already.
    """
    require_consortium_admin_on(actor, hospital, "reject hospitals")
    hospital = _locked(hospital)
    if hospital.status not in (Hospital.Status.REQUESTED, Hospital.Status.APPROVED):
        raise Conflict(
            f"hospital {hospital.slug!r} is {hospital.status}; only a requested or approved "
            "hospital can be rejected (revoke an enrolled hospital's tokens instead)",
            details={"status": hospital.status},
        )
    revoked = _revoke_unused_codes(hospital, timezone.now())
    hospital.status = Hospital.Status.REJECTED
    hospital.save(update_fields=["status"])
    audit_record(
        actor=actor,
        action="hospital.rejected",
        target=_target(hospital),
        hospital=hospital.slug,
        details={"reason": reason, "revoked_unused_codes": revoked},
    )
    return hospital


@transaction.atomic
def enrolment_code_issue(*, actor: Actor, hospital: Hospital) -> IssuedCode:
    """A fresh enrolment code (say, for a reinstalled agent); earlier unused codes of the
    hospital stop working. A hospital admin may issue one for their own hospital, but
    only a consortium admin may for a suspended one (that lifts the suspension once an
    agent enrols).

    Raises:
        NotFound / PermissionDenied: see accounts/permissions.py.
        Conflict: the hospital is not approved (requested: approve it; rejected).
    """
    require_manages_hospital(actor, hospital, "issue enrolment codes")
    hospital = _locked(hospital)
    if hospital.status == Hospital.Status.SUSPENDED:
        require_consortium_admin(actor, "issue an enrolment code for a suspended hospital")
    elif hospital.status not in (Hospital.Status.APPROVED, Hospital.Status.ENROLLED):
        raise Conflict(
            f"hospital {hospital.slug!r} is {hospital.status}; approve it first",
            details={"status": hospital.status},
        )
    return _issue_code(actor=actor, hospital=hospital)


# -- enrolment --------------------------------------------------------------------------


def _check_code(code: EnrolmentCode, now: datetime) -> None:
    if code.used_at is not None:
        raise EnrolmentCodeUsed(
            "this enrolment code was used already; ask your consortium admin for a fresh one"
        )
    if code.revoked_at is not None:
        raise EnrolmentCodeRevoked(
            "this enrolment code was revoked (replaced by a newer one, or the hospital's "
            "access was withdrawn); ask your consortium admin"
        )
    if code.expires_at <= now:
        raise EnrolmentCodeExpired(
            "this enrolment code expired; ask your consortium admin for a fresh one",
            details={"expired_at": code.expires_at.isoformat()},
        )


def _new_token(hospital: Hospital) -> IssuedToken:
    issued = secrets.issue(TOKEN_PREFIX)
    AgentToken.objects.create(hospital=hospital, key_id=issued.key_id, digest=issued.digest)
    return IssuedToken(plaintext=issued.plaintext, key_id=issued.key_id)


def _revoke_tokens(hospital: Hospital, now: datetime) -> list[str]:
    active = AgentToken.objects.filter(hospital=hospital, revoked_at__isnull=True)
    key_ids = list(active.values_list("key_id", flat=True))
    active.update(revoked_at=now)
    return key_ids


def _parse_identity(identity_key: str) -> IdentityKey:
    try:
        return parse_identity_key(identity_key)
    except ValueError as e:
        raise InvalidInput(
            "the identity key is unusable", details={"identity_key": [str(e)]}
        ) from None


def _set_identity(
    hospital: Hospital, identity: IdentityKey, now: datetime
) -> dict[str, Any] | None:
    """Pin ``identity`` as the hospital's; returns the ``identity.replaced`` details when it
    replaces another key (an identity or a legacy one), ``None`` when nothing changed or
    the hospital had no key before."""
    if hospital.identity_key == identity.text:
        return None
    replaced = {
        "previous_fingerprint": hospital.identity_fingerprint or None,
        "previous_generation": hospital.identity_generation,
        "legacy_public_key": hospital.legacy_public_key or None,
    }
    had_key = bool(hospital.identity_key or hospital.legacy_public_key)
    hospital.identity_key = identity.text
    hospital.identity_fingerprint = identity.fingerprint
    hospital.identity_generation += 1
    hospital.identity_enrolled_at = now
    return (
        {
            **replaced,
            "identity_fingerprint": identity.fingerprint,
            "identity_generation": hospital.identity_generation,
        }
        if had_key
        else None
    )


def agent_enrol(*, code: str, identity_key: str, source_ip: str | None = None) -> Enrolment:
    """An agent exchanges a one-time enrolment code and its ML-DSA-65 identity public key
    for its token and its relay credentials (both shown once).

    A code works once: the code's row is locked and marked used in the same transaction,
    so of two agents racing with one code only one enrols. A re-enrolling hospital's
    earlier tokens are revoked and its relay password replaced. The identity key's
    fingerprint is pinned; a new identity key advances the hospital's identity generation
    (what other hospitals' agents accept a changed key for) and is audited as
    ``identity.replaced``. A code that cannot be used changes nothing, and the failed
    attempt is audited.

    Raises:
        InvalidInput: a malformed code or identity key.
        EnrolmentCodeUnknown (404): no such code.
        EnrolmentCodeUsed / EnrolmentCodeRevoked / EnrolmentCodeExpired (410).
        RelayProvisioningFailed (503): the relay user could not be created.
    """
    identity = _parse_identity(identity_key)
    parts = secrets.split(code, CODE_PREFIX)
    if parts is None:
        raise InvalidInput(
            "the enrolment code is malformed",
            details={"code": [f"expected {CODE_PREFIX}_<key id>_<secret>"]},
        )
    key_id, random_part = parts
    candidate = EnrolmentCode.objects.filter(key_id=key_id).first()
    try:
        with transaction.atomic():
            return _enrol(
                candidate=candidate,
                random_part=random_part,
                identity=identity,
                source_ip=source_ip,
            )
    except PlatformError as e:
        hospital = candidate.hospital.slug if candidate is not None else ""
        audit_record(
            actor=Actor.anonymous(source_ip),
            action="agent.enrol_failed",
            target=f"enrolment_code:{key_id}",
            hospital=hospital,
            details={"key_id": key_id, "reason": e.code},
        )
        raise


def _enrol(
    *,
    candidate: EnrolmentCode | None,
    random_part: str,
    identity: IdentityKey,
    source_ip: str | None,
) -> Enrolment:
    # Hash always, so that a wrong secret and an unknown key id take the same time.
    digest = candidate.digest if candidate is not None else "0" * 64
    if not secrets.matches(random_part, digest) or candidate is None:
        raise EnrolmentCodeUnknown("no such enrolment code; check it was copied whole")
    hospital = Hospital.objects.select_for_update().get(pk=candidate.hospital_id)
    code = EnrolmentCode.objects.select_for_update().get(pk=candidate.pk)
    now = timezone.now()
    _check_code(code, now)
    if hospital.status not in (
        Hospital.Status.APPROVED,
        Hospital.Status.ENROLLED,
        Hospital.Status.SUSPENDED,
    ):
        raise EnrolmentCodeRevoked(f"hospital {hospital.slug!r} is {hospital.status}")
    # Belt and braces beside the row lock: the update matches only an unused code.
    if not EnrolmentCode.objects.filter(pk=code.pk, used_at__isnull=True).update(used_at=now):
        raise EnrolmentCodeUsed("this enrolment code was used already")

    actor = Actor(ActorKind.HOSPITAL, hospital=hospital, source_ip=source_ip)
    replaced = _revoke_tokens(hospital, now)
    token = _new_token(hospital)
    previous = hospital.status
    hospital.status = Hospital.Status.ENROLLED
    replaced = _set_identity(hospital, identity, now)
    hospital.enrolled_at = now
    hospital.save(update_fields=["status", "enrolled_at", *_IDENTITY_FIELDS])
    relay = _provision_relay_user(hospital, now)
    audit_record(
        actor=actor,
        action="agent.enrolled",
        target=_target(hospital),
        hospital=hospital.slug,
        details={
            "enrolment_code": code.key_id,
            "previous_status": previous,
            "identity_fingerprint": identity.fingerprint,
            "identity_generation": hospital.identity_generation,
            "relay_user": relay.username,
        },
    )
    if replaced is not None:
        audit_record(
            actor=actor,
            action="identity.replaced",
            target=_target(hospital),
            hospital=hospital.slug,
            details={**replaced, "via": f"enrolment code {code.key_id}"},
        )
    if replaced:
        audit_record(
            actor=actor,
            action="token.revoked",
            target=_target(hospital),
            hospital=hospital.slug,
            details={"key_ids": replaced, "reason": "re-enrolled"},
        )
    audit_record(
        actor=actor,
        action="token.issued",
        target=f"token:{token.key_id}",
        hospital=hospital.slug,
        details={"key_id": token.key_id, "reason": "enrolled"},
    )
    return Enrolment(hospital=hospital, token=token, relay=relay)


_IDENTITY_FIELDS = (
    "identity_key",
    "identity_fingerprint",
    "identity_generation",
    "identity_enrolled_at",
)


@transaction.atomic
def agent_identity_move(*, actor: Actor, identity_key: str) -> Hospital:
    """An agent of a hospital enrolled before identity keys (it holds only a legacy X25519
    key here) gives its first identity key, with its current token: the one move every
    hospital enrolled today makes, with no person involved. It is audited as
    ``identity.replaced`` and advances the identity generation, so the other hospitals'
    agents see it as a re-enrolment. Sending the key already held changes nothing (an
    agent that crashed before saving the answer asks again).

    Only this first step goes by token: a hospital that has an identity key changes it only
    by re-enrolling with a fresh enrolment code from an admin, so a stolen token cannot
    replace a key that peers have pinned.

    Raises:
        PermissionDenied: the actor is not an agent.
        InvalidInput: a malformed identity key.
        Conflict: the hospital has another identity key already.
    """
    require_agent(actor, "give its identity key")
    identity = _parse_identity(identity_key)
    hospital = _locked(actor.hospital)
    if hospital.identity_key == identity.text:
        return hospital
    if hospital.identity_key:
        raise Conflict(
            f"hospital {hospital.slug!r} has an identity key already (fingerprint "
            f"{hospital.identity_fingerprint}); a new one needs a re-enrolment with a fresh "
            "enrolment code from the consortium",
            details={"identity_generation": hospital.identity_generation},
        )
    replaced = _set_identity(hospital, identity, timezone.now())
    hospital.save(update_fields=list(_IDENTITY_FIELDS))
    audit_record(
        actor=actor,
        action="identity.replaced",
        target=_target(hospital),
        hospital=hospital.slug,
        details={
            **(replaced or {"identity_fingerprint": identity.fingerprint}),
            "identity_generation": hospital.identity_generation,
            "via": "the move from a legacy X25519 key, with the agent's token",
        },
    )
    return hospital


def relay_users_restore(*, actor: Actor) -> list[str]:
    """Apply every hospital's live relay user to the relay again, from the SHA-256 of its
    password kept here: after a relay restart that lost its users (a Redis without an ACL
    file) or a move to a new relay. Revoked and suspended users are not restored. Safe to
    run twice.

    Returns:
        The user names applied, in order.

    Raises:
        RelayProvisioningFailed: the relay refused or could not be reached; the users
            applied before the failure stay applied, and running it again finishes.
    """
    credentials = (
        RedisCredential.objects.filter(revoked_at__isnull=True, suspended_at__isnull=True)
        .select_related("hospital")
        .order_by("username")
    )
    provisioner = get_provisioner()
    restored = []
    for credential in credentials:
        slug = credential.hospital.slug
        provisioner.provision(
            username=credential.username, password_sha256=credential.password_sha256, slug=slug
        )
        # The rules follow this deployment's key layout, which may have changed since.
        pattern = relay_key_pattern(slug)
        if credential.key_pattern != pattern:
            RedisCredential.objects.filter(pk=credential.pk).update(key_pattern=pattern)
        restored.append(credential.username)
    audit_record(
        actor=actor,
        action="relay.users_restored",
        target="relay",
        details={"users": restored},
    )
    return restored


def relay_url_for_agents() -> str:
    """The relay's address as handed to agents: ``MEDSPLIT_RELAY_URL``, else ``REDIS_URL``
    stripped of its user, password and options. ``REDIS_URL`` is the coordinator's admin
    connection: its password must never reach a hospital, and its options (a CA file's
    path, say) name files on the coordinator's host."""
    parts = urlsplit(settings.MEDSPLIT.get("RELAY_URL") or settings.MEDSPLIT["REDIS_URL"])
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _provision_relay_user(hospital: Hospital, now: datetime) -> RelayCredentials:
    """Create or replace the hospital's relay user with a fresh password (shown once).

    Raises:
        Conflict: the hospital's relay user is suspended; a consortium admin lifts that
            first (``hospitals.relay_services.relay_user_lift``).
    """
    held = RedisCredential.objects.filter(hospital=hospital, suspended_at__isnull=False).first()
    if held is not None:
        raise Conflict(
            f"hospital {hospital.slug!r}'s relay user is suspended ({held.suspended_reason}); "
            "a consortium admin must lift the suspension before it enrols again",
            details={"relay_suspended_at": held.suspended_at.isoformat()},
        )
    password = token_urlsafe(_RELAY_PASSWORD_BYTES)
    digest = hashlib.sha256(password.encode()).hexdigest()
    username = relay_username(hospital.slug)
    pattern = relay_key_pattern(hospital.slug)
    credential, created = RedisCredential.objects.get_or_create(
        hospital=hospital,
        defaults={"username": username, "password_sha256": digest, "key_pattern": pattern},
    )
    if not created:
        credential.username = username
        credential.password_sha256 = digest
        credential.key_pattern = pattern
        credential.rotated_at = now
        credential.revoked_at = None
        credential.save()
    # Last, so that a relay that refuses rolls the whole enrolment back.
    get_provisioner().provision(username=username, password_sha256=digest, slug=hospital.slug)
    return RelayCredentials(
        url=relay_url_for_agents(),
        username=username,
        password=password,
        key_pattern=pattern,
    )


# -- tokens ---------------------------------------------------------------------------


@transaction.atomic
def agent_token_rotate(*, actor: Actor, token: AgentToken) -> IssuedToken:
    """An agent swaps the token it called with for a new one; the old one stops working
    at once. Of two rotations racing with one token, only one succeeds.

    Raises:
        PermissionDenied: the actor is not an agent.
        NotFound: ``token`` is not the agent's own.
        Conflict: ``token`` was revoked meanwhile.
    """
    require_agent(actor, "rotate agent tokens")
    if token.hospital_id != actor.hospital.pk:
        raise NotFound("no such token")
    hospital = _locked(actor.hospital)
    now = timezone.now()
    if not AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
        raise Conflict("this token was revoked meanwhile; it can no longer be rotated")
    new = _new_token(hospital)
    audit_record(
        actor=actor,
        action="token.rotated",
        target=f"token:{token.key_id}",
        hospital=hospital.slug,
        details={"old_key_id": token.key_id, "new_key_id": new.key_id},
    )
    audit_record(
        actor=actor,
        action="token.issued",
        target=f"token:{new.key_id}",
        hospital=hospital.slug,
        details={"key_id": new.key_id, "reason": "rotated"},
    )
    return new


@transaction.atomic
def hospital_tokens_revoke(*, actor: Actor, hospital: Hospital) -> Revocation:
    """Withdraw a hospital's access: every agent token (each stops working at once), every
    unused enrolment code, and its relay user (through the provisioner). The hospital is
    then suspended; a consortium admin lifts that by issuing a fresh enrolment code.

    Raises:
        NotFound / PermissionDenied: see accounts/permissions.py.
        Conflict: the hospital was never approved (requested or rejected).
        RelayProvisioningFailed (503): the relay user could not be removed; nothing changed.
    """
    require_manages_hospital(actor, hospital, "revoke tokens")
    hospital = _locked(hospital)
    if hospital.status in (Hospital.Status.REQUESTED, Hospital.Status.REJECTED):
        raise Conflict(
            f"hospital {hospital.slug!r} is {hospital.status}; it has no access to revoke",
            details={"status": hospital.status},
        )
    now = timezone.now()
    key_ids = _revoke_tokens(hospital, now)
    codes = _revoke_unused_codes(hospital, now)
    credential = RedisCredential.objects.filter(hospital=hospital).first()
    if credential is not None and credential.revoked_at is None:
        credential.revoked_at = now
        credential.save(update_fields=["revoked_at"])
    hospital.status = Hospital.Status.SUSPENDED
    hospital.save(update_fields=["status"])
    audit_record(
        actor=actor,
        action="token.revoked",
        target=_target(hospital),
        hospital=hospital.slug,
        details={
            "key_ids": key_ids,
            "revoked_unused_codes": codes,
            "relay_user": credential.username if credential is not None else None,
            "reason": "revoked by an admin",
        },
    )
    if credential is not None:
        # Last, so that a relay that refuses rolls the whole revocation back.
        get_provisioner().revoke(username=credential.username)
    return Revocation(
        hospital=hospital,
        tokens_revoked=len(key_ids),
        codes_revoked=codes,
        relay_user_revoked=credential is not None,
    )


# -- heartbeat --------------------------------------------------------------------------


@transaction.atomic
def agent_heartbeat(
    *,
    actor: Actor,
    agent_status: str,
    agent_version: str,
    dataset_summary: Mapping[str, Any] | None = None,
    data_problem: str = "",
    started_at: datetime | None = None,
) -> Hospital:
    """An agent says it is alive, which version it runs and what data it holds (shape,
    counts per label, split sizes: never data), or why its data cannot be used (its
    ``data_problem``: files and checks, never pixel values); then no summary stays on show.
    A changed version, summary or problem is audited.

    Raises:
        PermissionDenied: the actor is not an agent.
    """
    require_agent(actor, "send heartbeats")
    if agent_status not in Hospital.AgentStatus.values:
        raise InvalidInput(
            "unknown agent status",
            details={"agent_status": [f"one of {Hospital.AgentStatus.values}"]},
        )
    hospital = _locked(actor.hospital)
    problem = data_problem.strip()
    # Data that cannot be used has no summary worth showing: the old one goes.
    summary = {} if problem or dataset_summary is None else dict(dataset_summary)
    if problem:
        agent_status = Hospital.AgentStatus.DATA_PROBLEM
    changed = [
        name
        for name, old, new in (
            ("agent_version", hospital.agent_version, agent_version),
            ("dataset_summary", hospital.dataset_summary, summary),
            ("data_problem", hospital.data_problem, problem),
        )
        if old != new
    ]
    restarted = started_at is not None and started_at != hospital.agent_started_at
    if restarted:
        audit_record(
            actor=actor,
            action="agent.started",
            target=_target(hospital),
            hospital=hospital.slug,
            details={
                "started_at": started_at.isoformat(),
                "previous_start": (
                    hospital.agent_started_at.isoformat() if hospital.agent_started_at else None
                ),
                "agent_version": agent_version,
            },
        )
        hospital.agent_started_at = started_at
    hospital.last_seen_at = timezone.now()
    hospital.agent_status = agent_status
    hospital.agent_version = agent_version
    hospital.dataset_summary = summary
    hospital.data_problem = problem
    hospital.save(
        update_fields=[
            "last_seen_at",
            "agent_status",
            "agent_version",
            "dataset_summary",
            "data_problem",
            "agent_started_at",
        ]
    )
    if changed:
        audit_record(
            actor=actor,
            action="agent.reported",
            target=_target(hospital),
            hospital=hospital.slug,
            details={
                "changed": changed,
                "agent_version": agent_version,
                "dataset_summary": summary,
                "data_problem": problem[:500],
            },
        )
    return hospital
