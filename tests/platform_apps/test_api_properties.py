"""Property tests over every endpoint of the OpenAPI schema: no input gets a 5xx.

Schemathesis generates requests from the schema drf-spectacular publishes, valid and
not, and sends them to the real WSGI application as a consortium admin (the widest
view), as a hospital's agent and without credentials. Every answer must be below 500,
and every JSON error must have the one error shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.middleware.csrf import _get_new_csrf_string
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings

from kernel.actors import Role
from tests.platform_apps.conftest import issue_agent_token, make_hospital, make_person

# Built at import: generating the schema reads views and serializers, not the database.
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = get_wsgi_application()
OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Iterator[None]:
    """The WSGI handler closes "old" connections at each request, which would close the
    test's connection inside its transaction; Django's test client unhooks it the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def credentials(db: None, client) -> dict[str, dict[str, str]]:
    """Headers for each kind of caller, over a small consortium."""
    hospital = make_hospital(
        "st-marys",
        dataset_summary={
            "image_shape": [1, 28, 28],
            "label_counts": {"0": 10, "1": 10},
            "split_sizes": {"train": 16, "val": 4},
        },
    )
    client.force_login(make_person("ada", Role.CONSORTIUM_ADMIN))
    csrf = _get_new_csrf_string()
    session = client.cookies["sessionid"].value
    return {
        "admin": {"Cookie": f"sessionid={session}; csrftoken={csrf}", "X-CSRFToken": csrf},
        "agent": {"Authorization": f"Bearer {issue_agent_token(hospital)}"},
        "anonymous": {},
    }


def check(response) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if response.status_code >= 400 and "json" in response.headers.get("Content-Type", ""):
        body = json.loads(response.text)
        assert {"code", "message"} <= set(body), body


def test_the_schema_lists_every_part_of_the_api() -> None:
    paths = {op.path for op in OPERATIONS}
    for prefix in ("/api/auth/", "/api/hospitals/", "/api/agent/", "/api/jobs/", "/api/audit/"):
        assert any(p.startswith(prefix) for p in paths), prefix


@pytest.mark.django_db
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_no_input_gets_a_server_error(operation, credentials) -> None:
    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=operation.as_strategy())
    def run(case) -> None:
        for who in ("admin", "agent", "anonymous"):
            check(case.call(headers=credentials[who]))

    run()
