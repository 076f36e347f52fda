"""``manage.py relay_users_restore``: apply every hospital's relay user again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from hospitals.errors import RelayProvisioningFailed
from hospitals.services import relay_users_restore
from kernel.actors import Actor


class Command(BaseCommand):
    help = (
        "Apply every hospital's live Redis user to the relay again from the password hashes "
        "in the database: after a relay restart that lost its users, or a move to a new "
        "relay. Revoked users are left out. Uses the admin credentials of REDIS_URL and the "
        "configured MEDSPLIT_REDIS_ACL_PROVISIONER. The workers' user is made with "
        "relay_workers_user."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            restored = relay_users_restore(actor=Actor.system())
        except RelayProvisioningFailed as e:
            raise CommandError(f"{e} (run the command again once the relay answers)") from e
        self.stdout.write(f"{len(restored)} relay users applied: {', '.join(restored) or '-'}")
