"""A person's role in the consortium."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from kernel.actors import Role


class Membership(models.Model):
    """The role of one person; a hospital admin is bound to one hospital."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    role = models.CharField(max_length=32, choices=[(r.value, r.value) for r in Role])
    hospital = models.ForeignKey(
        "hospitals.Hospital", null=True, blank=True, on_delete=models.PROTECT, related_name="admins"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="hospital_admin_has_hospital",
                condition=(models.Q(role=Role.HOSPITAL_ADMIN.value, hospital__isnull=False))
                | (~models.Q(role=Role.HOSPITAL_ADMIN.value) & models.Q(hospital__isnull=True)),
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.role})"
