"""Fixtures of the accounts tests."""

from __future__ import annotations

from tests.platform.hospitals.fixtures import client_as, fast_password_hashing, fresh_throttles

__all__ = ["client_as", "fast_password_hashing", "fresh_throttles"]
