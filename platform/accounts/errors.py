"""Errors of signing in, in the platform's one hierarchy."""

from __future__ import annotations

from kernel.errors import PlatformError


class InvalidCredentials(PlatformError):
    """Wrong username or password, or an inactive account: the three are not told apart."""

    code = "invalid_credentials"
    status = 400
