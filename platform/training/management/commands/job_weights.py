"""``manage.py job_weights JOB``: where each part of a job's weights lives."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from training.models import Job
from training.weights import job_weights


class Command(BaseCommand):
    help = (
        "List where each part of a job's weights lives (no party holds the whole model): "
        "the server segment's file, and each hospital's part as sealed for it, by party, "
        "size and SHA-256. Never prints weights."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", type=int, help="the job's id")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        job = Job.objects.filter(pk=options["job"]).select_related("server_checkpoint").first()
        if job is None:
            raise CommandError(f"no job {options['job']}")
        parts = job_weights(job=job)
        if options["json"]:
            self.stdout.write(json.dumps([asdict(p) for p in parts], indent=2))
            return
        if not parts:
            self.stdout.write(f"job {job.pk} ({job.state}) holds no weights yet")
            return
        self.stdout.write(f"job {job.pk} ({job.state}): {len(parts)} part(s)")
        for part in parts:
            size = "?" if part.size_bytes is None else f"{part.size_bytes:,} bytes"
            self.stdout.write(f"- {part.party}: {part.what}")
            self.stdout.write(f"    at {part.where}")
            self.stdout.write(f"    {size}, sha256 {part.sha256}")
