"""This agent's per-job recipient keys: made when it first takes part in a job, kept in
the job's folder (``jobs/job-N/recipient.key``, 0600), deleted once the job has ended and
the agent has kept the final weights. Hand-offs of the job are sealed to the key's public
half, so once it is gone no recorded blob of the job can be opened, whoever later steals
the work directory."""

from __future__ import annotations

import re
from pathlib import Path

from hospital_agent.identity import forget_private, read_private, write_private
from medsplit.errors import ConfigError
from medsplit.protocol.keys import RecipientKey

RECIPIENT_KEY_FILE = "recipient.key"
_JOB_FOLDER = re.compile(r"job-(\d+)")


class JobKeys:
    """The per-job keys under ``<work_dir>/jobs/``."""

    def __init__(self, work_dir: Path) -> None:
        self.jobs = work_dir / "jobs"

    def path(self, job: int) -> Path:
        return self.jobs / f"job-{job}" / RECIPIENT_KEY_FILE

    def load(self, job: int) -> RecipientKey | None:
        """The key of ``job``, or ``None`` if this agent holds none (any more).

        Raises:
            ConfigError: the file is not a key, or others may read it.
        """
        path = self.path(job)
        if not path.exists():
            return None
        try:
            return RecipientKey.from_bytes(read_private(path))
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"{path} is not a recipient key: {e}") from e

    def load_or_create(self, job: int) -> RecipientKey:
        key = self.load(job)
        if key is None:
            key = RecipientKey.generate()
            write_private(self.path(job), key.to_bytes())
        return key

    def forget(self, job: int) -> bool:
        """Delete the key of ``job``; ``False`` if there was none."""
        return forget_private(self.path(job))

    def held(self) -> list[int]:
        """The jobs this agent holds a key for, in order."""
        if not self.jobs.is_dir():
            return []
        found = (_JOB_FOLDER.fullmatch(p.name) for p in self.jobs.iterdir())
        return sorted(int(m.group(1)) for m in found if m and self.path(int(m.group(1))).exists())
