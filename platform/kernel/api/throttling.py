"""Scoped rate limits that follow the settings as they are now.

DRF's stock ``ScopedRateThrottle`` has three traits this one does not:

- it reads ``DEFAULT_THROTTLE_RATES`` once, when the class is defined, so a changed
  setting (a test's ``override_settings``) would not apply; this one reads it per request;
- it keys signed-in callers by ``request.user.pk``, which is ``None`` for every agent, so
  all agents would share one budget; this one keys an agent by its hospital;
- it believes ``X-Forwarded-For`` unless NUM_PROXIES is set, so a client could dodge the
  limit by inventing addresses; this one takes the address the audit log takes
  (:func:`kernel.actors.client_ip`).
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

from kernel.actors import client_ip


class ScopedThrottle(ScopedRateThrottle):
    """Limits a view by its ``throttle_scope`` (``sign_in``, ``enrolment``, ``token``):
    per agent's hospital, per signed-in person, else per source address."""

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: Request, view: Any) -> str:
        hospital = getattr(request.user, "hospital", None)
        if hospital is not None:
            ident = f"agent-{hospital.pk}"
        elif request.user is not None and request.user.is_authenticated:
            ident = f"person-{request.user.pk}"
        else:
            ident = f"ip-{client_ip(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
