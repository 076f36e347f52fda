"""The overview raises what an administrator must not miss: a hospital's signed report that
the audit log was rewritten behind it, and a queue no live worker consumes."""

from __future__ import annotations

import pytest
from django.utils import timezone

from audit.models import WitnessReport
from tests.frontend.conftest import screenshot, sign_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_overview_raises_witness_reports_and_idle_queues(
    open_page, consortium_admin, three_hospitals, settings, redis_url: str
) -> None:
    # The queue heartbeats live on the relay; no worker runs in this test, so every queue
    # the coordinator sends work to is consumed by nobody.
    settings.MEDSPLIT = {**settings.MEDSPLIT, "REDIS_URL": redis_url}
    WitnessReport.objects.create(
        hospital=three_hospitals[0].slug,
        received_at=timezone.now(),
        witnessed_seq=42,
        witnessed_hash="a" * 64,
        found="missing",
        message="the chain now ends at event 30, but this hospital was shown event 42",
        signed="{}",
        signature="",
        verified=True,
    )
    page = open_page()
    sign_in(page, consortium_admin.username)
    reports = page.get_by_test_id("witness-reports")
    reports.wait_for()
    assert three_hospitals[0].slug in reports.inner_text()
    assert "signed by the hospital" in reports.inner_text()
    idle = page.get_by_test_id("idle-queues")
    idle.wait_for()
    assert "No live worker consumes" in idle.inner_text()
    screenshot(page, "overview-warnings")
