"""The OpenAPI schema of the accounts and hospitals routes is valid and complete."""

from __future__ import annotations

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

ROUTES = [
    path("api/", include("accounts.api.urls")),
    path("api/", include("hospitals.api.urls")),
]


@pytest.fixture(scope="module")
def schema() -> dict:
    GENERATOR_STATS.reset()
    with GENERATOR_STATS.silence():
        generated = SchemaGenerator(patterns=ROUTES).get_schema(request=None, public=True)
    warnings = [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    GENERATOR_STATS.reset()
    assert not warnings, warnings
    return generated


def test_the_schema_is_valid_openapi(schema) -> None:
    validate_schema(schema)


def test_every_route_is_described_with_its_bodies(schema) -> None:
    paths = schema["paths"]
    assert set(paths) == {
        "/api/auth/sign-in/",
        "/api/auth/sign-out/",
        "/api/auth/me/",
        "/api/people/",
        "/api/people/{person_id}/",
        "/api/hospitals/",
        "/api/hospitals/join-requests/",
        "/api/hospitals/{slug}/",
        "/api/hospitals/{slug}/approve/",
        "/api/hospitals/{slug}/reject/",
        "/api/hospitals/{slug}/relay/lift/",
        "/api/hospitals/{slug}/enrolment-codes/",
        "/api/hospitals/{slug}/tokens/",
        "/api/hospitals/{slug}/tokens/revoke/",
        "/api/agent/enrol/",
        "/api/agent/token/rotate/",
        "/api/agent/identity/",
        "/api/agent/heartbeat/",
        "/api/agent/audit/chain/",
        "/api/agent/audit/witness/",
    }
    enrol = paths["/api/agent/enrol/"]["post"]
    assert enrol["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/EnrolRequest"
    )
    assert {"201", "400", "404", "410", "429"} <= set(enrol["responses"])
    heartbeat = paths["/api/agent/heartbeat/"]["post"]
    assert heartbeat["security"] == [{"agentToken": []}, {"cookieAuth": []}]
    listed = paths["/api/hospitals/"]["get"]
    assert {p["name"] for p in listed["parameters"]} >= {"status", "online", "page", "page_size"}
    summary = schema["components"]["schemas"]["DatasetSummaryRequest"]
    assert set(summary["properties"]) == {
        *("image_shape", "label_counts", "split_sizes"),
        *("task", "masks", "mask_classes"),  # a segmentation set's
        *("test_label_counts", "test_mask_classes"),  # a local test set's
    }
