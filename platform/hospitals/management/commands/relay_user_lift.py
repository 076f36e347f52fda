"""``manage.py relay_user_lift SLUG``: lift the suspension of a hospital's relay user."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from hospitals.errors import RelayProvisioningFailed
from hospitals.models import Hospital
from hospitals.relay_services import relay_user_lift
from kernel.actors import Actor
from kernel.errors import Conflict


class Command(BaseCommand):
    help = (
        "Lift the suspension of a hospital's relay user (suspended by the workers when it "
        "stored more on the relay than its jobs allow; the reason is on its page and in the "
        "audit log). The same user and password work again. Uses REDIS_URL's admin user."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="the hospital's slug")

    def handle(self, *args: Any, **options: Any) -> None:
        hospital = Hospital.objects.filter(slug=options["slug"]).first()
        if hospital is None:
            raise CommandError(f"no hospital with slug {options['slug']!r}")
        try:
            relay_user_lift(actor=Actor.system(), hospital=hospital)
        except (Conflict, RelayProvisioningFailed) as e:
            raise CommandError(str(e)) from e
        self.stdout.write(f"the relay user of {hospital.slug} works again")
