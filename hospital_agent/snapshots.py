"""Snapshots of a turn on disk, so an agent killed mid-turn continues where it was."""

from __future__ import annotations

import re
from pathlib import Path

from hospital_agent.identity import write_private
from medsplit.turns.stores import StateStore, StoreError

_NAME = re.compile(r"before-(\d{8})\.safetensors")


class FileSnapshots(StateStore):
    """One file per snapshot in ``folder`` (mode 0600): step 0 and the last ``keep``."""

    def __init__(self, folder: Path, *, keep: int = 2) -> None:
        self.folder = folder
        self.keep = keep

    def _path(self, step: int) -> Path:
        return self.folder / f"before-{step:08d}.safetensors"

    def steps(self) -> list[int]:
        if not self.folder.exists():
            return []
        found = (_NAME.fullmatch(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def load(self, step: int) -> bytes:
        try:
            return self._path(step).read_bytes()
        except OSError as e:
            raise StoreError(f"no snapshot before step {step} in {self.folder}: {e}") from e

    def save(self, step: int, data: bytes) -> None:
        write_private(self._path(step), data)
        others = [s for s in self.steps() if s != 0]
        for old in others[: -self.keep]:
            self._path(old).unlink(missing_ok=True)
