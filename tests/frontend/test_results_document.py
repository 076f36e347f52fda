"""A finished job's results on its page and its result document, in Chromium against the
live coordinator (issue 24): the page's results beside the curves, each accuracy with its
baseline, and its links; the document as a page (its charts drawn) and as the download."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.frontend.conftest import screenshot, sign_in
from tests.platform_apps.reports.conftest import finished_job

__all__ = ["finished_job"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_finished_jobs_page_links_to_its_document_and_evaluates_again(
    open_page, consortium_admin, finished_job
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{finished_job.pk}")
    expect(page.get_by_test_id("job-state")).to_have_text("completed")
    # The results beside the curves: each accuracy with its baseline, the weighted mean
    # labelled as such, a hospital without a test set said so.
    results = page.get_by_test_id("results")
    rows = results.locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("accuracy 0.871 (majority class 0.625)")
    expect(rows.nth(0)).to_contain_text("0.923")
    expect(rows.nth(1)).to_contain_text("accuracy 0.712 (majority class 0.581)")
    expect(rows.nth(2)).to_contain_text("no test set")
    mean = results.get_by_test_id("results-weighted-mean")
    expect(mean).to_contain_text("weighted by their test-set sizes (not pooled)")
    expect(mean).to_contain_text("accuracy 0.803 (majority class 0.606)")
    charts = page.get_by_role("region", name="Charts")
    expect(charts.get_by_test_id("results")).to_be_visible()  # in the charts' grid
    screenshot(page, "job-results")

    with page.expect_download() as downloaded:
        page.get_by_test_id("job-document-download").click()
    download = downloaded.value
    assert download.suggested_filename == (
        f"medsplit-job-{finished_job.pk}-pneumonia-screening.html"
    )
    saved = download.path().read_text()
    assert 'data-testid="audit-verification"><span class="ok">verified</span>' in saved

    page.get_by_test_id("job-document").click()
    page.wait_for_url(f"**/jobs/{finished_job.pk}/document/")
    expect(page.get_by_test_id("document-title")).to_have_text(
        f"Job {finished_job.pk}: pneumonia screening"
    )
    for section in ("configuration", "participants", "curves", "results", "traffic"):
        expect(page.get_by_test_id(f"document-{section}")).to_be_visible()
    expect(page.get_by_test_id("privacy-not-measured")).to_be_visible()
    expect(page.get_by_test_id("audit-verification")).to_contain_text("verified")
    for chart in ("chart-loss", "chart-validation", "chart-traffic"):
        image = page.get_by_test_id(chart)
        expect(image).to_be_visible()
        assert image.evaluate("img => img.complete && img.naturalWidth > 0"), chart
    participants = page.get_by_test_id("document-participants").locator("tbody tr")
    expect(participants).to_have_count(3)
    screenshot(page, "job-document")
    page.get_by_test_id("document-back").click()
    page.wait_for_url(f"**/#/jobs/{finished_job.pk}")

    # A consortium admin asks for the final model to be evaluated again: the card follows
    # the new evaluation, and the button waits until it has ended.
    again = page.get_by_test_id("evaluate-again")
    expect(again).to_be_enabled()
    again.click()
    expect(results).to_contain_text(f"running, asked for by {consortium_admin.username}")
    expect(again).to_be_disabled()
    expect(page.get_by_test_id("evaluate-error")).to_have_text("")
