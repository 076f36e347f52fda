"""``manage.py relay_workers_user``: create or replace the workers' own Redis user."""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import audit_record
from hospitals.errors import RelayProvisioningFailed
from hospitals.relay_acl import RedisAclUsers, worker_key_patterns, workers_username
from kernel.actors import Actor
from medsplit.passwords import WeakPasswordError, check_password


class Command(BaseCommand):
    help = (
        "Create or replace the Redis ACL user the workers (Celery and the turn runner) use "
        "on the relay: this deployment's relay keys and Celery's only, no admin or dangerous "
        "commands. Uses the admin credentials of REDIS_URL. Without --password-env a "
        "password is generated and the workers' URL is printed once; one given must hold "
        "at least 128 bits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", help="default: <relay prefix>-workers")
        parser.add_argument(
            "--password-env",
            metavar="NAME",
            help="read the password from this environment variable instead of generating one",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"] or workers_username()
        if options["password_env"]:
            password = os.environ.get(options["password_env"], "")
            try:
                check_password(password, what=f"environment variable {options['password_env']}")
            except WeakPasswordError as e:
                raise CommandError(str(e)) from e
        else:
            password = secrets.token_urlsafe(32)
        digest = hashlib.sha256(password.encode()).hexdigest()
        try:
            RedisAclUsers().provision_workers(username=username, password_sha256=digest)
        except RelayProvisioningFailed as e:
            raise CommandError(str(e)) from e
        audit_record(
            actor=Actor.system(),
            action="relay.workers_user_provisioned",
            target=f"relay-user:{username}",
            details={"username": username, "keys": list(worker_key_patterns())},
        )
        self.stdout.write(f"relay user {username} provisioned for the workers")
        if not options["password_env"]:
            self.stdout.write(
                "set MEDSPLIT_WORKER_REDIS_URL (and CELERY_BROKER_URL) of the workers to "
                "(shown once):"
            )
            self.stdout.write(f"  {workers_url(username, password)}")


def workers_url(username: str, password: str) -> str:
    """REDIS_URL with the workers' user and password in place of the admin's."""
    parts = urlsplit(settings.MEDSPLIT["REDIS_URL"])
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    path = parts.path or "/0"
    credentials = f"{quote(username, safe='')}:{quote(password, safe='')}"
    return f"{parts.scheme}://{credentials}@{host}{port}{path}"
