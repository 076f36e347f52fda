"""One error hierarchy for the coordinator, and the one handler that renders every error.

Every error body has the same shape::

    {"code": "not_found", "message": "a person can act on this", "details": {...}}

Services raise :class:`PlatformError` subclasses; DRF's and Django's own exceptions are
mapped onto the same shape here, so clients see one format whatever failed.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback


class PlatformError(Exception):
    """Base of every error a service raises on purpose.

    Attributes:
        code: stable, machine-readable identifier (clients switch on it).
        status: the HTTP status the API answers with.
    """

    code = "error"
    status = 400

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidInput(PlatformError):
    """The request's content is wrong; ``details`` maps field names to problems."""

    code = "invalid"
    status = 400


class NotAuthenticated(PlatformError):
    code = "not_authenticated"
    status = 401


class PermissionDenied(PlatformError):
    """The actor is known but may not do this (for objects it may see)."""

    code = "permission_denied"
    status = 403


class NotFound(PlatformError):
    """No such object, or one the actor may not see: the two are not told apart."""

    code = "not_found"
    status = 404


class Conflict(PlatformError):
    """The object's state does not allow this now (a job transition out of order, say)."""

    code = "conflict"
    status = 409


class Gone(PlatformError):
    """A one-time secret already used, expired or revoked."""

    code = "gone"
    status = 410


class TooManyRequests(PlatformError):
    """Too many attempts, or too much at once: try again after ``retry_after`` seconds
    (sent as ``Retry-After``)."""

    code = "throttled"
    status = 429

    def __init__(
        self, message: str, *, retry_after: int, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, details=details)
        self.retry_after = max(1, int(retry_after))


_DRF_CODES: list[tuple[type[Exception], str]] = [
    (drf.NotAuthenticated, "not_authenticated"),
    (drf.AuthenticationFailed, "authentication_failed"),
    (drf.PermissionDenied, "permission_denied"),
    (drf.NotFound, "not_found"),
    (drf.MethodNotAllowed, "method_not_allowed"),
    (drf.NotAcceptable, "not_acceptable"),
    (drf.UnsupportedMediaType, "unsupported_media_type"),
    (drf.Throttled, "throttled"),
    (drf.ParseError, "malformed_request"),
    (drf.ValidationError, "invalid"),
]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error, one shape."""
    if isinstance(exc, Http404):
        exc = NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = PermissionDenied("you may not do this")

    if isinstance(exc, PlatformError):
        set_rollback()
        body = {"code": exc.code, "message": exc.message, "details": exc.details}
        headers = {}
        if isinstance(exc, TooManyRequests):
            headers["Retry-After"] = str(exc.retry_after)
        return Response(body, status=exc.status, headers=headers)

    if isinstance(exc, drf.APIException):
        set_rollback()
        code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), "error")
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if isinstance(exc, drf.Throttled) and exc.wait is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.wait)))
        if isinstance(exc, drf.ValidationError):
            details = (
                exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
            )
            body = {"code": code, "message": "the request has invalid fields", "details": details}
        else:
            body = {"code": code, "message": str(exc.detail), "details": {}}
        return Response(body, status=exc.status_code, headers=headers)
    return None  # unexpected: let Django answer 500 and log it
