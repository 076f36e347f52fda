"""The document's privacy section: the figures hospitals reported of their own exposure
(by least privilege) and a vertical job's label-leakage audit, else "not measured"."""

from __future__ import annotations

import pytest
from django.template.loader import render_to_string

from reports.privacy import PrivacySection, privacy_section

pytestmark = pytest.mark.django_db


def _rendered(section) -> str:
    return render_to_string("reports/privacy.html", {"privacy": section})


def test_without_figures_the_section_says_not_measured(finished_job, admin_actor) -> None:
    section = privacy_section(finished_job, admin_actor)
    assert not section.measured
    assert 'data-testid="privacy-not-measured"' in _rendered(section)


def test_a_label_leakage_audit_is_rendered_round_by_round() -> None:
    row = {"round": 0, "hospital": "city-general", "records": 86, "norm_auc": 0.9712,
           "cosine_auc": None}  # fmt: skip
    html = _rendered(PrivacySection(label_leakage=[row], figures=[]))
    assert 'data-testid="privacy-leakage"' in html and "not measured" not in html.lower()
    assert '<td>1</td><td>city-general</td><td class="n">86</td>' in html
    assert "0.971" in html and "labels not binary" in html


def test_the_figures_hospitals_reported_are_in_the_document_by_least_privilege(
    finished_job, admin_actor, hospital_admin_actor
) -> None:
    """Each hospital's reported figures reach the consortium's document, and a hospital
    admin's holds their own hospital's only."""
    from django.utils import timezone

    from training.models import PrivacyFigures

    for part in finished_job.participants.select_related("hospital"):
        ssim = {"st-marys": 0.8123, "city-general": 0.4567}.get(part.hospital.slug)
        if ssim is not None:
            PrivacyFigures.objects.create(
                job=finished_job,
                round_index=1,
                hospital=part.hospital,
                ssim=ssim,
                psnr=17.5,
                reported_at=timezone.now(),
            )
    everyone = privacy_section(finished_job, admin_actor)
    html = _rendered(everyone)
    assert "0.8123" in html and "0.4567" in html
    own = _rendered(privacy_section(finished_job, hospital_admin_actor))
    assert "0.8123" in own and "0.4567" not in own
