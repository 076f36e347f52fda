"""The filters of the audit log's list and exports (query parameters)."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms

from audit.models import AuditEvent


class _FilterForm(forms.Form):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        after, before = cleaned.get("created_after"), cleaned.get("created_before")
        if after is not None and before is not None and after >= before:
            raise forms.ValidationError("created_after must be earlier than created_before")
        return cleaned


class _IdFilter(django_filters.Filter):
    field_class = forms.IntegerField


class AuditEventFilter(django_filters.FilterSet):
    """Every filter is exact, except the time range: ``created_after <= t < created_before``."""

    actor = django_filters.CharFilter(
        field_name="actor", max_length=200, help_text='Who acted, e.g. "person:ada".'
    )
    action = django_filters.CharFilter(
        field_name="action", max_length=64, help_text='What happened, e.g. "job.started".'
    )
    hospital = django_filters.CharFilter(
        field_name="hospital", max_length=64, help_text="Slug of the hospital concerned."
    )
    job = _IdFilter(field_name="job_id", min_value=1, help_text="Id of the job concerned.")
    created_after = django_filters.IsoDateTimeFilter(
        field_name="created_at",
        lookup_expr="gte",
        help_text="ISO 8601; events at or after this moment.",
    )
    created_before = django_filters.IsoDateTimeFilter(
        field_name="created_at",
        lookup_expr="lt",
        help_text="ISO 8601; events before this moment.",
    )

    class Meta:
        model = AuditEvent
        fields = ["actor", "action", "hospital", "job", "created_after", "created_before"]
        form = _FilterForm
