"""``manage.py check --deploy``: a deployment runs several gunicorn processes, which must
share one cache, or each counts throttles and sign-in delays on its own."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def cache_is_shared(**_: Any) -> list[checks.CheckMessage]:
    """Local memory is per process: two processes allow twice every rate."""
    if not settings.CACHES["default"]["BACKEND"].endswith("LocMemCache"):
        return []
    return [
        checks.Warning(
            "MEDSPLIT_CACHE_URL is not set: each gunicorn process keeps its own throttles, "
            "sign-in delays and long-poll slots, so N processes allow N times every rate",
            hint="set MEDSPLIT_CACHE_URL=redis://... to a Redis every process reaches "
            "(docs/deploy.md, The coordinator)",
            id="coordinator.W001",
        )
    ]
