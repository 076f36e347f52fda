"""Reads about hospitals and their agents' tokens, filtered by who asks."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import django_filters
from django.conf import settings
from django.db.models import BooleanField, Case, QuerySet, Value, When
from django.utils import timezone

from hospitals.models import AgentToken, Hospital
from kernel.actors import Actor, ActorKind, Role
from kernel.errors import InvalidInput, NotFound
from kernel.permissions import (
    require_person,
    require_person_with_role,
    require_reads_hospital,
    require_sees_hospital,
)


def offline_after() -> timedelta:
    """How long a hospital may stay silent and still count as online."""
    return timedelta(seconds=settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"])


def hospital_is_online(*, hospital: Hospital, now: datetime | None = None) -> bool:
    """Whether ``hospital``'s agent sent a heartbeat within HOSPITAL_OFFLINE_AFTER_SECONDS."""
    now = now or timezone.now()
    return hospital.last_seen_at is not None and hospital.last_seen_at >= now - offline_after()


def _with_online(hospitals: QuerySet, now: datetime | None = None) -> QuerySet:
    cutoff = (now or timezone.now()) - offline_after()
    return hospitals.annotate(
        online=Case(
            When(last_seen_at__gte=cutoff, then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
    )


class HospitalFilter(django_filters.FilterSet):
    """``?status=enrolled&online=true``."""

    status = django_filters.ChoiceFilter(choices=Hospital.Status.choices)
    # A choice, not a BooleanFilter: that one would quietly ignore ``?online=maybe``.
    online = django_filters.ChoiceFilter(
        choices=[("true", "true"), ("false", "false")], method="filter_online"
    )

    class Meta:
        model = Hospital
        fields: list[str] = []

    def filter_online(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(online=value == "true")


def _visible(actor: Actor) -> QuerySet:
    require_person_with_role(actor)
    require_person(actor)
    hospitals = Hospital.objects.select_related("redis").order_by("name", "pk")
    if actor.is_system or actor.is_consortium_admin or actor.role == Role.OBSERVER:
        return hospitals
    if actor.kind == ActorKind.PERSON and actor.hospital is not None:
        return hospitals.filter(pk=actor.hospital.pk)
    return hospitals.none()


def hospital_list(*, actor: Actor, filters: Mapping[str, Any] | None = None) -> QuerySet:
    """The hospitals ``actor`` may see, each with ``online``, filtered by ``filters``.

    Consortium admins and observers see all; a hospital admin only their own.

    Raises:
        PermissionDenied: a person without a role, or an agent.
        InvalidInput: a filter value that makes no sense (``?online=maybe``).
    """
    filterset = HospitalFilter(data=filters or {}, queryset=_with_online(_visible(actor)))
    if not filterset.is_valid():
        raise InvalidInput("the filters are invalid", details=dict(filterset.errors))
    return filterset.qs


def hospital_get(*, actor: Actor, slug: str) -> Hospital:
    """One hospital, with ``online``, for a person who may see it.

    Raises:
        PermissionDenied: a person without a role; an agent (even for its own hospital:
            agents use the agent endpoints).
        NotFound: no such hospital, or one the actor may not see.
    """
    require_person_with_role(actor)
    hospital = _with_online(Hospital.objects.select_related("redis")).filter(slug=slug).first()
    if hospital is None:
        raise NotFound("no such hospital")
    require_sees_hospital(actor, hospital)
    require_person(actor)
    return hospital


def agent_tokens_of(*, actor: Actor, hospital: Hospital) -> QuerySet:
    """The tokens ``hospital``'s agents were issued, newest first (metadata only)."""
    require_reads_hospital(actor, hospital)
    return AgentToken.objects.filter(hospital=hospital).order_by("-created_at", "-pk")


def agent_hospital(*, actor: Actor) -> Hospital:
    """The hospital whose agent is ``actor``, fresh from the database, with ``online``."""
    if actor.hospital is None:
        raise NotFound("no such hospital")
    return _with_online(Hospital.objects.all()).get(pk=actor.hospital.pk)
