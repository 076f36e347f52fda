"""Errors of signing in, in the platform's one hierarchy."""

from __future__ import annotations

from kernel.errors import PlatformError, TooManyRequests


class InvalidCredentials(PlatformError):
    """Wrong username or password, or an inactive account: the three are not told apart."""

    code = "invalid_credentials"
    status = 400


class SignInDelayed(TooManyRequests):
    """Failed sign-ins for this username from this address: the next attempt must wait.

    Attributes:
        failures: the failures in a row so far.
        first: whether this is the first attempt refused during this delay.
    """

    def __init__(self, message: str, *, retry_after: int, failures: int, first: bool) -> None:
        super().__init__(message, retry_after=retry_after)
        self.failures = failures
        self.first = first
