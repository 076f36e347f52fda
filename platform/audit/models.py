"""The audit log: append-only rows, each chained to the previous one by its hash.

See :mod:`audit.chain` for what a row's hash covers, :func:`audit.services.audit_record`
for the only way rows are added, and :func:`audit.selectors.audit_verify_chain` for
the check. On PostgreSQL, triggers (migration 0002) refuse UPDATE, DELETE and TRUNCATE
of events as well; on every database the model and its queryset refuse them.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models

from audit.chain import CONTENT_FIELDS, GENESIS, content_hash
from audit.errors import AppendOnlyError


def _refuse(what: str) -> NoReturn:
    raise AppendOnlyError(f"the audit log is append-only: {what} is refused")


class AuditEventQuerySet(models.QuerySet):
    """Reads as usual; every bulk write is refused."""

    def update(self, **kwargs: Any) -> NoReturn:
        _refuse("updating audit events")

    def delete(self) -> NoReturn:
        _refuse("deleting audit events")

    def _raw_delete(self, using: str) -> NoReturn:
        _refuse("deleting audit events")

    def bulk_update(self, objs: Any, fields: Any, batch_size: Any = None) -> NoReturn:
        _refuse("updating audit events")

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("adding audit events other than through audit.services.audit_record")


class AuditEvent(models.Model):
    """One state change or security-relevant event. Never patient data.

    ``id`` is the sequence number: rows are 1, 2, 3, ... without gaps, so a removed row
    shows as a gap (and a removed last row against :class:`AuditChainHead`).
    """

    id = models.BigIntegerField(
        primary_key=True, editable=False, help_text="Sequence number: 1, 2, 3, ... no gaps."
    )
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
    # Unique: two rows naming the same predecessor would be a fork.
    prev_hash = models.CharField(max_length=64, unique=True)
    hash = models.CharField(max_length=64, unique=True)
    # HMAC of ``hash`` under a key the database never holds (audit/macs.py), and that
    # key's id: a row written with SQL has none that verifies.
    mac_key_id = models.CharField(max_length=16, blank=True)
    mac = models.CharField(max_length=64, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        # Django's own saves and deletes go through the base manager: refuse them too.
        base_manager_name = "objects"
        constraints = [
            models.CheckConstraint(name="audit_event_id_from_1", condition=models.Q(id__gte=1))
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.action} by {self.actor}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Insert a row built by ``audit_record``; anything else is refused."""
        if not self._state.adding:
            _refuse(f"changing audit event {self.id}")
        if not self.hash or self.hash != content_hash(self.content()):
            _refuse("adding audit events other than through audit.services.audit_record")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"deleting audit event {self.id}")

    def content(self) -> dict[str, Any]:
        """The fields the hash covers (see :mod:`audit.chain`)."""
        return {name: getattr(self, name) for name in CONTENT_FIELDS}


class AuditChainHead(models.Model):
    """The tip of the chain: one row holding the last event's id and hash.

    This row is the audit log's lock. ``audit_record`` takes it with
    ``select_for_update()`` inside its transaction and holds it until that transaction
    commits. It protects the rule *each event's id is the previous event's id plus one
    and its prev_hash is the previous event's hash*: two appends never read the same tip,
    so the chain never forks (the unique ``prev_hash`` and ``id`` are the backstop). On
    SQLite ``select_for_update()`` does nothing, but SQLite lets one transaction write at
    a time, and a transaction that read a stale tip fails instead of writing.

    Keeping the count here lets verification see a removed *last* row, which no gap in
    the ids would show.
    """

    SINGLETON = 1

    id = models.PositiveSmallIntegerField(primary_key=True, default=SINGLETON)
    last_id = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default=GENESIS)

    class Meta:
        constraints = [
            models.CheckConstraint(name="audit_chain_head_singleton", condition=models.Q(id=1)),
            models.CheckConstraint(
                name="audit_chain_head_count", condition=models.Q(last_id__gte=0)
            ),
        ]

    def __str__(self) -> str:
        return f"audit chain head: {self.last_id} events, last {self.last_hash[:12]}"


class WitnessReport(models.Model):
    """A hospital's signed word that a head of the chain it was shown is gone from it
    (``audit.witness``). Not part of the chain, on purpose: it reports on the chain.

    Like the chain, it is only ever added to: the model refuses changes and deletes.
    """

    hospital = models.CharField(max_length=64, db_index=True)
    received_at = models.DateTimeField(db_index=True)
    witnessed_seq = models.BigIntegerField()
    witnessed_hash = models.CharField(max_length=64)
    #: What the chain holds there now: another hash, or "missing" (the tail was cut).
    found = models.CharField(max_length=200)
    message = models.TextField()
    #: The canonical text the agent signed, and its signature (base64).
    signed = models.TextField()
    signature = models.TextField()
    #: Whether the signature verified against the hospital's pinned identity key.
    verified = models.BooleanField()

    class Meta:
        ordering = ["-received_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.hospital}: head {self.witnessed_seq} {self.found}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            _refuse(f"changing witness report {self.pk}")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"deleting witness report {self.pk}")
