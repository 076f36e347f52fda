"""Reads about people and their roles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.actors import Role

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from hospitals.models import Hospital


def role_of(user: AbstractBaseUser) -> tuple[Role | None, Hospital | None]:
    """The role of ``user`` and, for a hospital admin, the hospital.

    Django superusers are consortium admins; a person without a membership has no role
    and may do nothing.
    """
    if not user.is_authenticated or not user.is_active:
        return None, None
    membership = getattr(user, "membership", None)
    if membership is not None:
        return Role(membership.role), membership.hospital
    if user.is_superuser:
        return Role.CONSORTIUM_ADMIN, None
    return None, None
