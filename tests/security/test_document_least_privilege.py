"""Least privilege in a job's result document, attacked: the admin of a hospital outside
the job asks for its document, an agent presents its token, and hospital A's admin reads
A's document looking for B's and C's per-hospital figures (kernel/permissions.py)."""

from __future__ import annotations

import re

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
    shown = [
        f"{f.accuracy:.4f}",
        f"{f.loss:.4f}",
        f"{2 * f.bytes_up} B",
        f"{2 * f.bytes_down} B",
        f"{2 * f.handoff_bytes} B",
    ]
    if f.test is not None:  # its final model's evaluation on its own test set
        shown += [f"{f.test[name]:.4f}" for name in ("accuracy", "auc", "baseline_accuracy")]
    return shown


def _shows(html: str, secret: str) -> bool:
    """Whether ``secret`` is in ``html`` as itself, not inside a longer number."""
    return re.search(rf"(?<![0-9.]){re.escape(secret)}(?![0-9])", html) is not None


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
        assert _shows(html, secret), f"A's own {secret!r} is missing"
    for other in ("city-general", "northside"):
        for secret in _secrets(other):
            assert not _shows(html, secret), f"A's document shows {other}'s {secret!r}"
    # Of the others: their names and places, as the job's API shows them, and their
    # evaluation's status; the weighted means, labelled as such.
    assert "City General" in html and "Northside" in html
    assert 'data-testid="document-scope"' in html
    theirs = re.search(
        r'<tr data-hospital="city-general">\s*<td>City General</td>(.*?)</tr>', html, re.S
    )
    assert theirs and "completed" in theirs.group(1)
    assert "not shown to you" in theirs.group(1) and "48" not in theirs.group(1)
    mean = re.search(r'data-testid="results-weighted-mean">(.*?)</tr>', html, re.S).group(1)
    assert "weighted by their test-set sizes (not pooled)" in mean
    a, b = FIGURES["st-marys"].test, FIGURES["city-general"].test
    weighted = (a["samples"] * a["accuracy"] + b["samples"] * b["accuracy"]) / 112
    assert f"{weighted:.4f}" in mean and "112" not in mean  # the total test size is not theirs
