"""Every API error has one shape: ``{code, message, details}``, from one handler."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "details"}, body
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    return body


@pytest.mark.django_db
def test_no_credentials_is_401_with_a_challenge() -> None:
    response = APIClient().get("/api/jobs/")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
def test_a_bad_token_is_401() -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer msa_000000000000_nope")
    assert_error(client.get("/api/agent/assignments/"), 401, "authentication_failed")


@pytest.mark.django_db
def test_wrong_method_is_405(client_for, consortium_admin) -> None:
    assert_error(client_for(consortium_admin).delete("/api/jobs/"), 405, "method_not_allowed")


@pytest.mark.django_db
def test_malformed_json_is_400(client_for, consortium_admin) -> None:
    response = client_for(consortium_admin).post(
        "/api/jobs/", data=b"{not json", content_type="application/json"
    )
    assert_error(response, 400, "malformed_request")


@pytest.mark.django_db
def test_invalid_fields_are_named_in_details(client_for, consortium_admin) -> None:
    body = assert_error(client_for(consortium_admin).post("/api/jobs/", {}), 400, "invalid")
    assert body["details"], "each invalid field should be named"
