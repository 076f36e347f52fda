"""The Celery app, configured from the coordinator's Django settings (``CELERY_*``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The coordinator's apps live in platform/ (not an importable package: see DESIGN.md).
_PLATFORM = Path(__file__).resolve().parent.parent / "platform"
if str(_PLATFORM) not in sys.path:
    sys.path.insert(0, str(_PLATFORM))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from celery import Celery, signals  # noqa: E402
from django.conf import settings  # noqa: E402

app = Celery("medsplit", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@signals.worker_init.connect
@signals.worker_process_init.connect
def prepare_torch(**_: object) -> None:
    """Deterministic kernels, so a job's weights equal unsplit training (invariant 1)."""
    if settings.MEDSPLIT["DETERMINISTIC"]:
        torch.use_deterministic_algorithms(True)
