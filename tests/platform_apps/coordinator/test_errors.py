"""Every error has one shape: code, message, details."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


@pytest.mark.django_db
def test_unauthenticated_api_call_gets_the_error_shape() -> None:
    response = APIClient().get("/api/schema/")
    assert response.status_code in (200, 401, 403)
    response = APIClient().get("/api/no-such-endpoint/")
    assert response.status_code == 404


@pytest.mark.django_db
def test_schema_is_served(client_for, consortium_admin) -> None:
    response = client_for(consortium_admin).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")
