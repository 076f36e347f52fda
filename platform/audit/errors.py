"""Errors of the audit log.

These are errors of the code that calls the audit log, not of an API request: they are
not :class:`kernel.errors.PlatformError` (which would answer 400 to a client for a
mistake the client did not make). Left uncaught, they end in a 500 and a log line.
"""

from __future__ import annotations


class AuditError(ValueError):
    """``audit_record`` was given something it cannot record: details that are not plain
    JSON or are too large, a field that is empty or too long, an address that is not
    an IP address. Nothing was written."""


class AppendOnlyError(Exception):
    """Something tried to change or remove audit rows, or to add one outside
    ``audit_record``. The audit log is append-only; nothing was changed."""


class ChainHeadMissing(Exception):
    """The chain's head row is gone while events exist: someone removed it behind the
    application's back. Appends stop until ``manage.py audit_verify`` has been looked at,
    because starting a new head would hide the tampering."""
