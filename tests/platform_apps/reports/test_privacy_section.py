"""The document's privacy section: whatever privacy figures the platform holds, from a
``privacy_figures(job, actor)`` selector where an app provides one, else "not measured"."""

from __future__ import annotations

import sys
import types

import pytest
from django.template.loader import render_to_string

from kernel.actors import Role
from reports.privacy import PrivacySection, privacy_section
from tests.platform_apps.conftest import person_actor

pytestmark = pytest.mark.django_db


def _rendered(section) -> str:
    return render_to_string("reports/privacy.html", {"privacy": section})


def test_without_figures_the_section_says_not_measured(finished_job, admin_actor) -> None:
    section = privacy_section(finished_job, admin_actor)
    assert not section.measured and section.source == ""
    assert 'data-testid="privacy-not-measured"' in _rendered(section)


def test_a_privacy_figures_selector_is_asked_for_the_reader_and_rendered(
    monkeypatch, finished_job, hospital_admin, hospital_a
) -> None:
    asked = []

    def privacy_figures(job, actor):
        asked.append((job.pk, actor.hospital.slug))
        return {"conv1 inversion SSIM": {"hospital": actor.hospital.slug, "value": 0.9401}}

    package = types.ModuleType("privacy")
    selectors = types.ModuleType("privacy.selectors")
    selectors.privacy_figures = privacy_figures
    monkeypatch.setitem(sys.modules, "privacy", package)
    monkeypatch.setitem(sys.modules, "privacy.selectors", selectors)

    reader = person_actor(hospital_admin, Role.HOSPITAL_ADMIN, hospital_a)
    section = privacy_section(finished_job, reader)
    assert asked == [(finished_job.pk, "st-marys")]
    assert section.source == "privacy.selectors" and section.measured
    html = _rendered(section)
    assert "not measured" not in html.lower()
    assert "conv1 inversion SSIM" in html and "0.9401" in html and "st-marys" in html


def test_a_label_leakage_audit_is_rendered_round_by_round() -> None:
    row = {"round": 0, "hospital": "city-general", "records": 86, "norm_auc": 0.9712,
           "cosine_auc": None}  # fmt: skip
    html = _rendered(PrivacySection(label_leakage=[row], figures=[], source=""))
    assert 'data-testid="privacy-leakage"' in html and "not measured" not in html.lower()
    assert '<td>1</td><td>city-general</td><td class="n">86</td>' in html
    assert "0.971" in html and "labels not binary" in html
