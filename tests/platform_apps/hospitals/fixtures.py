"""Fixtures the accounts and hospitals tests share (imported by both conftests)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient


@pytest.fixture(autouse=True)
def fresh_throttles() -> None:
    """Rate-limit counters live in the cache: each test starts with none."""
    cache.clear()


@pytest.fixture
def client_as(
    request: pytest.FixtureRequest, client_for, agent_client
) -> Callable[[str], APIClient]:
    """A client for one caller: a person fixture's name (``consortium_admin``,
    ``hospital_admin``, ``observer``, ``no_role_person``), ``agent_a``/``agent_b`` (the
    agents of hospital A and B) or ``anonymous``."""

    def make(who: str) -> APIClient:
        if who == "anonymous":
            return APIClient()
        if who == "agent_a":
            return agent_client(request.getfixturevalue("hospital_a"))
        if who == "agent_b":
            return agent_client(request.getfixturevalue("hospital_b"))
        return client_for(request.getfixturevalue(who))

    return make
