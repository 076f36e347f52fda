"""Hospitals of the consortium, their one-time enrolment codes, their agents' tokens and
their relay (Redis) users."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

# Lower-case letters, digits and inner hyphens: safe in URLs, Redis key patterns (no glob
# characters, no ``:``) and Redis ACL user names.
SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"
slug_validator = RegexValidator(
    SLUG_PATTERN, "lower-case letters, digits and inner hyphens, at most 64 characters"
)


class Hospital(models.Model):
    """A member of the consortium (never any of its data)."""

    class Status(models.TextChoices):
        REQUESTED = "requested"  # asked to join, waiting for an admin
        APPROVED = "approved"  # an enrolment code was issued, no agent yet
        ENROLLED = "enrolled"  # an agent holds a token
        REJECTED = "rejected"
        SUSPENDED = "suspended"  # tokens revoked by an admin

    class AgentStatus(models.TextChoices):
        """What the agent said in its last heartbeat."""

        STARTING = "starting"
        IDLE = "idle"
        BUSY = "busy"  # taking its turn in a job
        ERROR = "error"
        DATA_PROBLEM = "data_problem"  # running, but its local data cannot be used

    name = models.CharField(max_length=200, unique=True)
    slug = models.SlugField(max_length=64, unique=True, validators=[slug_validator])
    contact_email = models.EmailField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    # The static X25519 public key (32 bytes, base64) of agents enrolled before identity
    # keys; kept for the record. No hand-off is sealed to it any more.
    legacy_public_key = models.CharField(max_length=64, blank=True)
    # The agent's ML-DSA-65 identity key (1,952 bytes, base64): it signs the hospital's
    # hand-offs and per-job keys. Its SHA-256 (hex) is pinned here at enrolment and shown to
    # administrators and agents for comparison out of band.
    identity_key = models.TextField(blank=True)
    identity_fingerprint = models.CharField(max_length=64, blank=True)
    # How many identity keys the hospital has had: each re-enrolment with a new key (and the
    # one move from a legacy key) adds one, is audited, and is what peers' agents accept a
    # changed key for.
    identity_generation = models.PositiveIntegerField(default=0)
    identity_enrolled_at = models.DateTimeField(null=True, blank=True)
    enrolled_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=64, blank=True)
    agent_status = models.CharField(max_length=16, choices=AgentStatus.choices, blank=True)
    # Why the agent's local data cannot be used (files and checks, never pixel values),
    # as its last heartbeat said; its dataset summary is cleared meanwhile.
    data_problem = models.TextField(blank=True)
    # When the agent's process started, as it says: a new value is a restart, audited.
    agent_started_at = models.DateTimeField(null=True, blank=True)
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

    class Meta:
        ordering = ["-created_at", "-id"]


class AgentToken(models.Model):
    """A hospital agent's bearer token, stored hashed; revocation takes effect at once."""

    hospital = models.ForeignKey(Hospital, on_delete=models.CASCADE, related_name="tokens")
    key_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RedisCredential(models.Model):
    """The hospital's relay user. The password is shown once, at enrolment; Redis ACLs
    accept its SHA-256 (``#<hex>``), so the coordinator keeps only that.

    ``key_pattern`` is the pattern of the hospital's streams,
    ``<prefix>:hospital:<slug>:*`` (``medsplit.channel.keys``), shown to its agent; the
    user's full rules (streams, counters, sent and received blobs) are
    ``hospitals.relay_acl.agent_acl_rules``.
    """

    hospital = models.OneToOneField(Hospital, on_delete=models.CASCADE, related_name="redis")
    username = models.CharField(max_length=80, unique=True)
    password_sha256 = models.CharField(max_length=64)
    key_pattern = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    #: Switched off on the relay because the hospital stored more than its jobs allow
    #: (``hospitals.relay_services``); only a consortium admin lifts it.
    suspended_at = models.DateTimeField(null=True, blank=True)
    suspended_reason = models.TextField(blank=True)
