"""The API's docs page works inside a closed hospital network: nothing from a CDN."""

from __future__ import annotations

import re

import pytest
from django.test import Client


@pytest.mark.django_db
def test_docs_page_loads_only_scripts_the_coordinator_serves() -> None:
    client = Client()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.content.decode())
    assert sources, "the page should load its scripts"
    for source in sources:
        assert source.startswith("/"), f"{source} is fetched from elsewhere"
        if source.startswith("/static/"):
            assert client.get(source).status_code == 200, source


@pytest.mark.django_db
def test_schema_is_openapi_3() -> None:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")
