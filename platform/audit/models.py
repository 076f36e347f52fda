"""The audit log: append-only rows, each chained to the previous one by its hash."""

from __future__ import annotations

from django.db import models


class AuditEvent(models.Model):
    """One state change or security-relevant event. Never patient data."""

    created_at = models.DateTimeField(db_index=True)
    actor_kind = models.CharField(max_length=16)
    actor = models.CharField(max_length=200, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    # Denormalised so rows outlive what they are about, and filter cheaply.
    hospital = models.CharField(max_length=64, blank=True, db_index=True)
    job_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    details = models.JSONField(default=dict, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["id"]
