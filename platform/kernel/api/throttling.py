"""Scoped rate limits, counted atomically in the cache every process shares.

DRF's stock ``ScopedRateThrottle`` has four traits this one does not:

- it reads ``DEFAULT_THROTTLE_RATES`` once, when the class is defined, so a changed
  setting (a test's ``override_settings``) would not apply; this one reads it per request;
- it keys signed-in callers by ``request.user.pk``, which is ``None`` for every agent, so
  all agents would share one budget; this one keys an agent by its hospital;
- it believes ``X-Forwarded-For`` unless NUM_PROXIES is set; this one takes the address
  the audit log takes (:func:`kernel.actors.client_ip`, which applies
  ``MEDSPLIT_TRUSTED_PROXIES``);
- it reads a list of past requests, appends and writes it back, so concurrent requests
  in several gunicorn processes all read the same list and all pass; this one counts
  with the cache's atomic ``add`` and ``incr`` (single Redis commands), so exactly the
  rate passes however many processes and threads ask at once.

The count is a sliding window made of two fixed ones: the previous window's count,
weighted by how much of it still lies within the last period, plus the current one's.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from kernel.actors import client_ip

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """``"10/minute"`` as (10 requests, 60 seconds): DRF's notation (``s``, ``m``, ``h``,
    ``d``: only the period's first letter counts)."""
    count, _, period = rate.partition("/")
    return int(count), _PERIODS[period[:1]]


def take(scope: str, ident: str, rate: str, *, now: float | None = None) -> float | None:
    """Count one request of ``ident`` in ``scope`` against ``rate``.

    Returns:
        ``None`` when it may go ahead; else the seconds until one more would be allowed
        (the refused request is not counted).
    """
    limit, period = parse_rate(rate)
    now = time.time() if now is None else now
    window, into = divmod(now, period)
    base = f"throttle:{scope}:{ident}"
    current_key, previous_key = f"{base}:{int(window)}", f"{base}:{int(window) - 1}"
    # Kept for two periods: the next window still weighs this one.
    cache.add(current_key, 0, timeout=2 * period)
    current = cache.incr(current_key)
    previous = cache.get(previous_key, 0)
    remaining = 1 - into / period  # share of the previous window still within the period
    if previous * remaining + current <= limit:
        return None
    cache.decr(current_key)
    return _wait(limit, period, previous, current - 1, into)


def _wait(limit: int, period: int, previous: int, current: int, into: float) -> float:
    """Seconds until ``previous * remaining + current + 1 <= limit`` holds again."""
    room = limit - current - 1
    if room >= 0 and previous > 0:
        # Within this window, once enough of the previous one has slid out.
        return max(0.0, (1 - room / previous) * period - into)
    # In the next window, this one's count becomes the weighted one.
    weighted = current
    share = 1 - (limit - 1) / weighted if weighted > 0 else 0.0
    return (period - into) + max(0.0, share) * period


class ScopedThrottle(BaseThrottle):
    """Limits a view by its ``throttle_scope`` (``sign_in``, ``enrolment``, ``token``,
    ``cut_table``): per agent's hospital, per signed-in person, else per client address."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        scope = getattr(view, "throttle_scope", None)
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(scope) if scope else None
        if rate is None:
            return True
        self._wait = take(scope, self.ident(request), rate)
        return self._wait is None

    def wait(self) -> float | None:
        return None if self._wait is None else math.ceil(self._wait)

    @staticmethod
    def ident(request: Request) -> str:
        """Whose budget a request spends: its agent's hospital, its person, its address."""
        hospital = getattr(request.user, "hospital", None)
        if hospital is not None:
            return f"agent-{hospital.pk}"
        if request.user is not None and request.user.is_authenticated:
            return f"person-{request.user.pk}"
        return f"ip-{client_ip(request)}"
