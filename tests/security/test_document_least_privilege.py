"""Least privilege in a job's result document, attacked: the admin of a hospital outside
the job asks for its document, an agent presents its token, and hospital A's admin reads
A's document looking for B's and C's per-hospital figures (kernel/permissions.py)."""

from __future__ import annotations

import pytest

from kernel.actors import Role
from tests.platform_apps.conftest import make_hospital, make_person
from tests.platform_apps.reports.conftest import FIGURES, finished_job

__all__ = ["finished_job"]

pytestmark = pytest.mark.django_db

PAGES = ("/jobs/{}/document/", "/jobs/{}/document/download/")


def _secrets(slug: str) -> list[str]:
    """What of ``slug``'s part a document shows when it shows it: its losses and
    accuracies (as the document rounds them) and its byte counts."""
    f = FIGURES[slug]
    return [
        f"{f.accuracy:.4f}",
        f"{f.loss:.4f}",
        f"{2 * f.bytes_up} B",
        f"{2 * f.bytes_down} B",
        f"{2 * f.handoff_bytes} B",
    ]


def test_another_hospitals_admin_cannot_fetch_a_jobs_document(client_for, finished_job) -> None:
    outsider = make_person("olaf", Role.HOSPITAL_ADMIN, make_hospital("eastside"))
    client = client_for(outsider)
    for page in PAGES:
        response = client.get(page.format(finished_job.pk))
        assert response.status_code == 404  # not told apart from a job that does not exist
        assert "pneumonia" not in response.content.decode()


def test_an_agent_token_fetches_no_document(agent_client, finished_job, hospital_a) -> None:
    client = agent_client(hospital_a)  # a participant's own agent
    for page in PAGES:
        response = client.get(page.format(finished_job.pk))
        assert response.status_code == 401
        assert "pneumonia" not in response.content.decode()


def test_a_hospital_admins_document_carries_only_their_own_hospitals_figures(
    client_for, hospital_admin, finished_job, three_hospitals
) -> None:
    response = client_for(hospital_admin).get(f"/jobs/{finished_job.pk}/document/download/")
    assert response.status_code == 200
    html = response.content.decode()
    for secret in _secrets("st-marys"):
        assert secret in html, f"A's own {secret!r} is missing"
    for other in ("city-general", "northside"):
        for secret in _secrets(other):
            assert secret not in html, f"A's document shows {other}'s {secret!r}"
    # Of the others: their names and places, as the job's API shows them.
    assert "City General" in html and "Northside" in html
    assert 'data-testid="document-scope"' in html
