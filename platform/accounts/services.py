"""Writes about people: signing in and out, creating people and changing their roles."""

from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING, Final

from django.contrib.auth import authenticate, get_user_model, login, logout
from django.contrib.auth.password_validation import validate_password
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts import sign_in_delay
from accounts.errors import InvalidCredentials, SignInDelayed
from accounts.models import Membership
from accounts.selectors import membership_of, role_of
from audit.services import audit_record
from hospitals.models import Hospital
from kernel.actors import Actor, ActorKind, Role, client_ip
from kernel.errors import Conflict, InvalidInput, NotFound
from kernel.permissions import can_see_person, require_consortium_admin, require_person

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.http import HttpRequest
    from rest_framework.request import Request


class _Unset(Enum):
    UNSET = "unset"


UNSET: Final = _Unset.UNSET
"""A field a partial update leaves as it is."""


def person_sign_in(
    *, request: HttpRequest | Request, username: str, password: str
) -> AbstractBaseUser:
    """Check ``username`` and ``password`` and start a session; audit every outcome.

    Failures in a row for one username from one address slow the next attempt
    (:mod:`accounts.sign_in_delay`); while the delay runs the password is not checked.
    Audit rows name the username and the client's address, never the password.

    Raises:
        SignInDelayed: the delay of earlier failures is still running (429).
        InvalidCredentials: wrong username or password, or an inactive account.
    """
    ip = client_ip(request)
    try:
        attempt = sign_in_delay.begin(username, ip)
    except SignInDelayed as e:
        if e.first:  # once per delay: a flood of refusals does not flood the log
            audit_record(
                actor=Actor.anonymous(ip),
                action="auth.sign_in_delayed",
                target=f"person:{username}",
                details={"username": username, "failures": e.failures, "wait": e.retry_after},
            )
        raise
    try:
        user = authenticate(request, username=username, password=password)
        if user is None:
            delay = attempt.failed()
            audit_record(
                actor=Actor.anonymous(ip),
                action="auth.sign_in_failed",
                target=f"person:{username}",
                details={
                    "username": username,
                    "failures": attempt.failures + 1,
                    "next_attempt_after": delay,
                },
            )
            raise InvalidCredentials("wrong username or password")
        with transaction.atomic():
            login(request, user)
            role, hospital = role_of(user)
            audit_record(
                actor=Actor(
                    ActorKind.PERSON, user=user, role=role, hospital=hospital, source_ip=ip
                ),
                action="auth.signed_in",
                target=f"person:{user.get_username()}",
                hospital=hospital.slug if hospital is not None else "",
                details={"username": user.get_username()},
            )
        attempt.succeeded()
    finally:
        attempt.release()
    return user


def sign_in_throttled(*, request: HttpRequest | Request, wait: float | None) -> None:
    """Audit that sign-ins from the request's address are throttled: once per address
    and throttle period, however many more it sends meanwhile."""
    ip = client_ip(request)
    hold = max(1, math.ceil(wait or 1))
    if cache.add(f"sign-in:throttled:{ip}", 1, timeout=hold):
        audit_record(
            actor=Actor.anonymous(ip),
            action="auth.sign_in_throttled",
            target=f"address:{ip}",
            details={"retry_after": hold},
        )


def person_sign_out(*, request: HttpRequest | Request, actor: Actor) -> None:
    """End the session of the person behind ``request`` (any signed-in person).

    Raises:
        PermissionDenied: an agent (its token is revoked, not signed out).
    """
    require_person(actor)
    with transaction.atomic():
        if actor.user is not None:
            audit_record(
                actor=actor,
                action="auth.signed_out",
                target=f"person:{actor.user.get_username()}",
            )
        logout(request)


def _hospital_by_slug(slug: str | None, errors: dict[str, list[str]]) -> Hospital | None:
    if slug is None:
        return None
    hospital = Hospital.objects.filter(slug=slug).first()
    if hospital is None:
        errors.setdefault("hospital", []).append(f"no hospital {slug!r}")
    return hospital


def _check_role_and_hospital(
    role: Role | None, hospital: Hospital | None, errors: dict[str, list[str]]
) -> None:
    if role == Role.HOSPITAL_ADMIN and hospital is None and "hospital" not in errors:
        errors.setdefault("hospital", []).append("a hospital admin needs a hospital")
    if role != Role.HOSPITAL_ADMIN and hospital is not None:
        errors.setdefault("hospital", []).append("only hospital admins belong to a hospital")


@transaction.atomic
def person_create(
    *,
    actor: Actor,
    username: str,
    password: str,
    role: Role,
    hospital_slug: str | None = None,
    email: str = "",
) -> AbstractBaseUser:
    """Create a person with ``role`` (a hospital admin of hospital ``hospital_slug``).

    Only a consortium admin may. The password must pass Django's password validators.

    Raises:
        PermissionDenied: the actor is not a consortium admin.
        InvalidInput: a taken username, a weak password, a missing or unexpected
            hospital; ``details`` names each field.
    """
    require_consortium_admin(actor, "add people")
    user_model = get_user_model()
    errors: dict[str, list[str]] = {}
    try:
        user_model.username_validator(username)
    except ValidationError as e:
        errors["username"] = list(e.messages)
    if user_model.objects.filter(username__iexact=username).exists():
        errors.setdefault("username", []).append("this username is taken")
    try:
        validate_password(password, user=user_model(username=username, email=email))
    except ValidationError as e:
        errors["password"] = list(e.messages)
    hospital = _hospital_by_slug(hospital_slug, errors)
    _check_role_and_hospital(role, hospital, errors)
    if errors:
        raise InvalidInput("the person could not be created", details=errors)
    try:
        with transaction.atomic():
            user = user_model.objects.create_user(username=username, password=password, email=email)
    except IntegrityError:
        raise InvalidInput(
            "the person could not be created", details={"username": ["this username is taken"]}
        ) from None
    Membership.objects.create(user=user, role=role.value, hospital=hospital)
    audit_record(
        actor=actor,
        action="person.created",
        target=f"person:{username}",
        hospital=hospital.slug if hospital is not None else "",
        details={"username": username, "role": role.value},
    )
    return user


@transaction.atomic
def person_update(
    *,
    actor: Actor,
    person: AbstractBaseUser,
    role: Role | _Unset | None = UNSET,
    hospital_slug: str | _Unset | None = UNSET,
    is_active: bool | _Unset = UNSET,
) -> AbstractBaseUser:
    """Change a person's role, hospital or whether the account is active.

    ``role=None`` takes the role away (the person may then do nothing). A person who is
    no longer a hospital admin leaves their hospital. A consortium admin cannot demote
    or deactivate themself (the consortium would risk having no admin left).
    Deactivation ends the person's access at their next request.

    Raises:
        NotFound: the actor may not see ``person``.
        PermissionDenied: the actor is not a consortium admin.
        InvalidInput: a missing, unknown or unexpected hospital.
        Conflict: a consortium admin demoting or deactivating themself.
    """
    if not can_see_person(actor, person):
        raise NotFound("no such person")
    require_consortium_admin(actor, "change people")
    person = get_user_model().objects.select_for_update().get(pk=person.pk)
    old_role, old_hospital = membership_of(person)
    new_role = old_role if role is UNSET else role
    errors: dict[str, list[str]] = {}
    if hospital_slug is not UNSET:
        new_hospital = _hospital_by_slug(hospital_slug, errors)
    else:
        new_hospital = old_hospital if new_role == Role.HOSPITAL_ADMIN else None
    _check_role_and_hospital(new_role, new_hospital, errors)
    if new_role is None and person.is_superuser:
        errors.setdefault("role", []).append(
            "a Django superuser is always a consortium admin; remove superuser status first"
        )
    if errors:
        raise InvalidInput("the person could not be changed", details=errors)
    new_active = person.is_active if is_active is UNSET else is_active
    if (
        actor.user is not None
        and actor.user.pk == person.pk
        and (new_role != Role.CONSORTIUM_ADMIN or not new_active)
    ):
        raise Conflict(
            "you cannot take away your own consortium admin role or deactivate yourself; "
            "ask another consortium admin"
        )

    changes: dict[str, list[object]] = {}
    if new_role != old_role:
        changes["role"] = [_value(old_role), _value(new_role)]
    if new_hospital != old_hospital:
        changes["hospital"] = [_slug(old_hospital), _slug(new_hospital)]
    if new_active != person.is_active:
        changes["is_active"] = [person.is_active, new_active]
        person.is_active = new_active
        person.save(update_fields=["is_active"])
    if "role" in changes or "hospital" in changes:
        if new_role is None:
            Membership.objects.filter(user=person).delete()
        else:
            Membership.objects.update_or_create(
                user=person, defaults={"role": new_role.value, "hospital": new_hospital}
            )
    if changes:
        audit_record(
            actor=actor,
            action="person.updated",
            target=f"person:{person.get_username()}",
            hospital=_slug(new_hospital) or _slug(old_hospital) or "",
            details={"username": person.get_username(), "changes": changes},
        )
    return get_user_model().objects.select_related("membership__hospital").get(pk=person.pk)


def _value(role: Role | None) -> str | None:
    return role.value if role is not None else None


def _slug(hospital: Hospital | None) -> str | None:
    return hospital.slug if hospital is not None else None
