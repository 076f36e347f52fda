"""Model modules for the tests of ``MODULE:FACTORY`` models: one that leaves a mark when it
is imported (to prove a party refused it before importing it), and this process's list of
model modules set for one test and put back after it."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from medsplit.models import model_modules, set_model_modules
from medsplit.models.factory import ModelModules

#: The factory's arguments: small_cnn's, as a JSON object.
ARGS = {"spatial_dims": 2, "in_channels": 1, "num_classes": 2}


@dataclass(frozen=True)
class MarkedModule:
    """A module in a folder on ``sys.path`` whose import creates ``marker``."""

    module: str
    marker: Path

    @property
    def factory(self) -> str:
        """Its factory's ``MODULE:FACTORY`` name (small_cnn, from JSON arguments)."""
        return f"{self.module}:net"

    def imported(self) -> bool:
        return self.marker.exists() or self.module in sys.modules


def marked_module(folder: Path) -> MarkedModule:
    """Write a module of a unique name into ``folder`` (the caller puts it on
    ``sys.path``): importing it creates its marker file, anywhere, in any process."""
    name = f"marked_models_{uuid.uuid4().hex[:8]}"
    marker = folder / f"{name}.imported"
    (folder / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from medsplit.models.small_cnn import small_cnn\n\n\n"
        "def net(**kwargs):\n"
        "    return small_cnn(**kwargs)\n"
    )
    return MarkedModule(name, marker)


@contextmanager
def listed(modules: Iterable[str], *, setting: str = "the test's list") -> Iterator[ModelModules]:
    """This process's list of model modules is ``modules`` until the block ends."""
    before = model_modules()
    try:
        yield set_model_modules(list(modules), setting=setting)
    finally:
        set_model_modules(list(before.modules), setting=before.setting)
