"""``manage.py check --deploy``: a metrics token short enough to guess is refused."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

#: As long as the coordinator's own secrets' random part (32 random bytes, URL-safe).
MIN_TOKEN_LENGTH = 32


@checks.register(checks.Tags.security, deploy=True)
def metrics_token_is_long(**_: Any) -> list[checks.CheckMessage]:
    """The token guards counts of jobs and hospitals: it must not be guessable."""
    token = settings.MEDSPLIT.get("METRICS_TOKEN", "")
    if token and len(token) < MIN_TOKEN_LENGTH:
        return [
            checks.Warning(
                f"MEDSPLIT_METRICS_TOKEN has {len(token)} characters; use at least "
                f"{MIN_TOKEN_LENGTH} random ones",
                hint="python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                id="monitoring.W001",
            )
        ]
    return []
