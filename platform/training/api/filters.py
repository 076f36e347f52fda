"""Query filters of the job list: ``?state=running&model=small_cnn&hospital=st-marys``."""

from __future__ import annotations

import django_filters

from training.models import Job
from training.states import JobState


class JobFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=JobState.choices)
    model = django_filters.CharFilter(field_name="model_name")
    hospital = django_filters.CharFilter(
        field_name="participants__hospital__slug", distinct=True, help_text="a hospital's slug"
    )

    class Meta:
        model = Job
        fields = ["state", "model", "hospital"]
