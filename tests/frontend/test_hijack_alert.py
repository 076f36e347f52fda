"""A hospital's agent found the server hijacking a job: the dashboard alerts on the job's
page and on the hospital's (the audit log's ``job.hijack_suspected``, as the agent's
report leaves it)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from hospitals.hijack import record_hijack_report
from medsplit.defenses.splitguard import SplitGuardDetected
from tests.frontend.conftest import screenshot, sign_in
from tests.platform_apps.conftest import agent_actor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_hijack_alert_is_shown_on_the_job_and_on_the_hospital(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    hospital = three_hospitals[0]
    job = make_job()
    reason = str(SplitGuardDetected(step=13, score=0.02, probes=3, threshold=0.3))
    record_hijack_report(actor=agent_actor(hospital), job_id=job.pk, turn_id=7, reason=reason)
    page = open_page()
    sign_in(page, consortium_admin.username)

    page.goto(f"/#/jobs/{job.pk}")
    alert = page.get_by_test_id("hijack-alert")
    expect(alert).to_contain_text("hijacking suspected")
    expect(alert).to_contain_text("stopped taking part in this job")
    expect(alert).to_contain_text("turn 7")
    expect(alert).to_contain_text("SplitGuard's score over 3 fake-label batches is 0.020")
    screenshot(page, "job-hijack-alert")

    page.goto(f"/#/hospitals/{hospital.slug}")
    alert = page.get_by_test_id("hijack-alert")
    expect(alert).to_contain_text("This hospital found the server's gradients")
    expect(alert.get_by_role("link", name=f"job {job.pk}")).to_have_attribute(
        "href", f"#/jobs/{job.pk}"
    )
    screenshot(page, "hospital-hijack-alert")


def test_a_job_without_a_hijack_report_shows_no_alert(
    open_page, consortium_admin, make_job
) -> None:
    job = make_job()
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    expect(page.get_by_test_id("hijack-alerts")).to_be_attached()
    expect(page.get_by_test_id("hijack-alert")).to_have_count(0)
