"""``manage.py audit_verify``: check the whole audit chain; non-zero exit if it fails."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.selectors import audit_verify_chain


class Command(BaseCommand):
    help = (
        "Re-hash every audit event in order and name the first that does not match "
        "(changed content, broken link, removed rows, removed tail). Exit code 1 if any."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        result = audit_verify_chain()
        if options["json"]:
            self.stdout.write(json.dumps(asdict(result)))
        if result.ok:
            if not options["json"]:
                self.stdout.write(
                    f"audit chain verifies: {result.checked} events, "
                    f"head {result.head_id} {result.head_hash}"
                )
            return
        problem = result.problem
        raise CommandError(
            f"audit chain does NOT verify at row {problem.row_id}: {problem.kind}: "
            f"{problem.message} ({result.checked} events matched before it)",
            returncode=1,
        )
