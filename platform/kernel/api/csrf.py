"""Django's CSRF check, for API views that take no session yet (signing in).

DRF checks CSRF only for requests its session authentication authenticates, so a view
without authentication (the sign-in) gets none. Without one, a page on another site can
post a form to the sign-in with the attacker's own credentials and sign the victim's
browser in as the attacker (login CSRF): what the victim then does lands in the
attacker's account.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from rest_framework.request import Request

from kernel.errors import PermissionDenied


class CsrfRefused(PermissionDenied):
    """A write without the CSRF cookie and token of this coordinator's own pages."""

    code = "csrf_failed"


class _Check(CsrfViewMiddleware):
    """Django's check, answering with the reason instead of a 403 page (as DRF's)."""

    def _reject(self, request: HttpRequest, reason: str) -> str:  # type: ignore[override]
        return reason


def _no_response(request: HttpRequest) -> None:
    return None


def require_csrf(request: Request, *, what: str) -> None:
    """Django's CSRF check on ``request``, as every session write gets it: the csrftoken
    cookie and the same token in ``X-CSRFToken``, and a same-origin (or trusted)
    ``Origin``, or over HTTPS ``Referer``.

    Raises:
        CsrfRefused: the check failed; the message says how to pass it, ``details``
            Django's reason.
    """
    check = _Check(_no_response)
    django_request = request._request
    check.process_request(django_request)
    reason = check.process_view(django_request, None, (), {})
    if reason:
        raise CsrfRefused(
            f"{what} needs the CSRF cookie and token of this coordinator's own pages: load "
            "the dashboard (GET /) first, which sets the csrftoken cookie, and send the "
            "same token in the X-CSRFToken header",
            details={"csrf": [str(reason)]},
        )
