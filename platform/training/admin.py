"""Django admin for jobs: read-only, so every change goes through the services (and the
audit log) via the API."""

from __future__ import annotations

from django.contrib import admin

from training.models import HandOff, Job, JobParticipant, MetricPoint, Round, Turn


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ParticipantInline(admin.TabularInline):
    model = JobParticipant
    fields = ["position", "hospital", "feature_set"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(_ReadOnly):
    list_display = ["id", "name", "model_name", "mode", "state", "current_round", "created_at"]
    list_filter = ["state", "mode", "model_name"]
    search_fields = ["name", "model_name"]
    inlines = [ParticipantInline]


@admin.register(Round)
class RoundAdmin(_ReadOnly):
    list_display = ["id", "job", "index", "status", "started_at", "finished_at"]
    list_filter = ["status"]


@admin.register(Turn)
class TurnAdmin(_ReadOnly):
    list_display = ["id", "job", "round", "position", "attempt", "hospital", "status", "steps"]
    list_filter = ["status"]


@admin.register(MetricPoint)
class MetricPointAdmin(_ReadOnly):
    list_display = ["id", "job", "turn", "step", "time", "loss"]


@admin.register(HandOff)
class HandOffAdmin(_ReadOnly):
    list_display = ["id", "job", "turn", "sender", "recipient", "size_bytes", "created_at"]
