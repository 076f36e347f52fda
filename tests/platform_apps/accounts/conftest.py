"""Fixtures of the accounts tests."""

from __future__ import annotations

from tests.platform_apps.hospitals.fixtures import client_as, fresh_throttles

__all__ = ["client_as", "fresh_throttles"]
