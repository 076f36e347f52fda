"""An export of a completed job's model to one participating hospital, by consent."""

from __future__ import annotations

from django.db import models


class ExportState(models.TextChoices):
    PENDING = "pending"  # waiting for every participating hospital's answer
    REFUSED = "refused"  # a hospital refused: final
    APPROVED = "approved"  # every hospital approved: segments may be sealed


class ModelExport(models.Model):
    """A request to hand a completed job's full model to ``recipient``."""

    job = models.ForeignKey("training.Job", on_delete=models.CASCADE, related_name="exports")
    recipient = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    state = models.CharField(
        max_length=16, choices=ExportState.choices, default=ExportState.PENDING
    )
    refused_by = models.ForeignKey(
        "hospitals.Hospital", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    refusal_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The recipient's fresh export key (SignedRecipientKey for ``export-N``), base64.
    recipient_key = models.TextField(blank=True)
    recipient_key_signature = models.TextField(blank=True)
    recipient_key_sha256 = models.CharField(max_length=64, blank=True)
    fetched_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"export {self.pk} of job {self.job_id} to {self.recipient} ({self.state})"


class ExportConsent(models.Model):
    """One participating hospital's approval of an export."""

    export = models.ForeignKey(ModelExport, on_delete=models.CASCADE, related_name="consents")
    hospital = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    approved_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["export", "hospital"], name="export_consent_once")
        ]


#: The name of the part the worker seals: the job's final server segment.
SERVER_PART = "server"


class ExportPart(models.Model):
    """One segment sealed to the export key: ciphertext only, never a weight in clear."""

    export = models.ForeignKey(ModelExport, on_delete=models.CASCADE, related_name="parts")
    name = models.CharField(max_length=100)  # the sender's slug, or SERVER_PART
    sender = models.ForeignKey(
        "hospitals.Hospital", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    ciphertext = models.BinaryField()
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["export", "name"], name="export_part_once")]
