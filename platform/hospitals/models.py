"""Hospitals of the consortium, their one-time enrolment codes and their agents' tokens."""

from __future__ import annotations

from django.db import models


class Hospital(models.Model):
    """A member of the consortium (never any of its data)."""

    class Status(models.TextChoices):
        REQUESTED = "requested"  # asked to join, waiting for an admin
        APPROVED = "approved"  # an enrolment code was issued, no agent yet
        ENROLLED = "enrolled"  # an agent holds a token
        REJECTED = "rejected"
        SUSPENDED = "suspended"  # tokens revoked by an admin

    name = models.CharField(max_length=200, unique=True)
    slug = models.SlugField(max_length=64, unique=True)
    contact_email = models.EmailField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    # The agent's X25519 public key (32 bytes, base64); hand-offs are encrypted to it.
    public_key = models.CharField(max_length=64, blank=True)
    agent_version = models.CharField(max_length=64, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Shape, count per label and split sizes as the agent reported them; never data.
    dataset_summary = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class EnrolmentCode(models.Model):
    """A one-time code an agent exchanges for its token; expires and is single use."""

    hospital = models.ForeignKey(Hospital, on_delete=models.CASCADE, related_name="codes")
    key_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)


class AgentToken(models.Model):
    """A hospital agent's bearer token, stored hashed; revocation takes effect at once."""

    hospital = models.ForeignKey(Hospital, on_delete=models.CASCADE, related_name="tokens")
    key_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RedisCredential(models.Model):
    """The hospital's relay user. The password is shown once, at enrolment; Redis ACLs
    accept its SHA-256 (``#<hex>``), so the coordinator keeps only that."""

    hospital = models.OneToOneField(Hospital, on_delete=models.CASCADE, related_name="redis")
    username = models.CharField(max_length=64, unique=True)
    password_sha256 = models.CharField(max_length=64)
    key_prefix = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
