"""The dashboard's parts of two platform features, in a real browser against the live
coordinator: a job whose model is a ``MODULE:FACTORY`` from a module the coordinator lists
(the new-job form, issue 20), a vertical job's record alignment on its page and the
alignment actions in the audit filter (issue 19)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.frontend.conftest import screenshot, sign_in
from tests.model_modules import ARGS, listed
from tests.platform_apps.conftest import agent_actor
from training import services
from training.alignment import alignment_report
from training.apps import MODEL_MODULES_SETTING
from training.models import Job, JobAlignment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FACTORY = "medsplit.models.small_cnn:small_cnn"


def test_a_job_with_a_factory_model_from_a_listed_module_through_the_form(
    open_page, consortium_admin, three_hospitals
) -> None:
    # The live server runs in this process: its list is this process's.
    with listed(["medsplit.models"], setting=MODEL_MODULES_SETTING):
        page = open_page()
        sign_in(page, consortium_admin.username)
        page.goto("/#/jobs/new")
        form = page.get_by_test_id("job-form")
        form.wait_for()
        page.get_by_test_id("model-kind-factory").check()
        # The coordinator says which modules it lists (GET /api/model-modules/).
        expect(page.get_by_test_id("model-modules")).to_contain_text("medsplit.models")
        form.get_by_label("Model (MODULE:FACTORY)").fill(FACTORY)
        arguments = form.get_by_label("Model arguments (JSON)")
        # Not a JSON object: refused in the page, beside the field, before any request.
        arguments.fill("[1, 2]")
        arguments.blur()  # its message shows at once (the layout moves)
        expect(form.locator("[data-field=model_args] .field-error")).to_contain_text("JSON object")
        for hospital in three_hospitals[:2]:
            page.get_by_test_id(f"participant-{hospital.slug}").check()
        page.get_by_test_id("create-job").click()
        box = form.locator("[data-field=model_args]")
        expect(box.locator(".field-error")).to_contain_text("must be a JSON object")
        assert Job.objects.count() == 0
        # The factory's own refusal of its arguments comes back from the cut table.
        arguments.fill('{"spatial_dims": 2, "in_channels": 1, "num_classes": 2, "depth": 3}')
        arguments.blur()
        # (Building and tracing a model costs the coordinator a second or more.)
        expect(page.locator(".cut-table .warn")).to_contain_text(
            "refuses the model arguments", timeout=30_000
        )
        arguments.fill('{"spatial_dims": 2, "in_channels": 1, "num_classes": 2}')
        arguments.blur()
        expect(form.locator(".form-error")).to_have_text("")  # the page's refusal went
        # The cut table at the participants' shape, with the factory's arguments.
        page.get_by_test_id("cut-pool1").check(timeout=30_000)
        expect(page.locator(".cut-table caption")).to_contain_text(FACTORY)
        screenshot(page, "new-job-factory")
        page.get_by_test_id("create-job").click()
        page.wait_for_url(re.compile(r"#/jobs/\d+$"))
        job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
        assert job.model_name == FACTORY and job.description["model_args"] == ARGS
        assert job.description["cuts"] == ["pool1"]
        expect(page.locator("tr", has_text="Model arguments")).to_contain_text('"in_channels":1')

    # A module the coordinator does not list: the API's 400 is shown beside the field.
    with listed([], setting=MODEL_MODULES_SETTING):
        page.goto("/#/jobs/new")
        form.wait_for()
        page.get_by_test_id("model-kind-factory").check()
        expect(page.get_by_test_id("model-modules")).to_contain_text("lists no model modules")
        form.get_by_label("Model (MODULE:FACTORY)").fill(FACTORY)
        form.get_by_label("Model arguments (JSON)").fill('{"in_channels": 1}')
        form.get_by_label("Model arguments (JSON)").blur()
        page.get_by_test_id("participant-" + three_hospitals[0].slug).check()
        page.get_by_test_id("create-job").click()
        error = form.locator("[data-field=model] .field-error")
        expect(error).to_contain_text("MEDSPLIT_MODEL_MODULES")
        expect(form.get_by_label("Model (MODULE:FACTORY)")).to_have_attribute(
            "aria-invalid", "true"
        )


def test_a_vertical_jobs_form_options_and_its_record_alignment_on_the_job_page(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    # The form: vertical's configurations, its min_records with its default, the label party.
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    form.locator("select[name=mode]").select_option(label="Vertical (sum, labels at home)")
    label_party = "the first participant (the top of the list) is the label party"
    expect(form.get_by_text(label_party, exact=False)).to_be_visible()
    records = form.get_by_label("Min records")
    expect(records).to_have_value("100")
    for hospital in three_hospitals[:2]:
        page.get_by_test_id(f"participant-{hospital.slug}").check()
    expect(page.get_by_test_id("cut-pool")).to_be_checked(timeout=30_000)
    # (Below the mode's floor of 10 the coordinator answers 500 for now, not a 400 on
    # mode_options: tests/platform_apps/training/api/test_views.py, xfail.)
    records.fill("60")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    assert job.mode == "vertical"
    assert job.description["mode_options"] == {
        "join": "sum",
        "labels": "hospital",
        "min_records": 60,
    }

    # Running, nobody reported yet: the section says it waits.
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    page.reload()
    box = page.get_by_test_id("alignment")
    expect(box).to_contain_text("waiting for every party")
    expect(box).to_contain_text("0 of 2")
    # The label party reports 86 shared records, then the other the same: agreed (polled).
    first, second = three_hospitals[:2]
    alignment_report(actor=agent_actor(first), job_id=job.pk, digest="ab" * 32, size=86)
    expect(box).to_contain_text("1 of 2", timeout=10_000)
    alignment_report(actor=agent_actor(second), job_id=job.pk, digest="ab" * 32, size=86)
    expect(box).to_contain_text("agreed", timeout=10_000)
    expect(box).to_contain_text("86 records (the job needs at least 60 records)")
    expect(box).to_contain_text("2 of 2")
    screenshot(page, "job-alignment")

    # Another vertical job whose label party holds too few: failed, and why.
    small = make_job(
        mode="vertical",
        cuts=["pool1", "pool"],
        mode_options={"join": "sum", "labels": "hospital", "min_records": 50},
        state="scheduled",
    )
    small = services.job_start(job=small)
    alignment_report(actor=agent_actor(first), job_id=small.pk, digest="cd" * 32, size=40)
    assert JobAlignment.objects.get(job=small).status == JobAlignment.Status.TOO_SMALL
    page.goto(f"/#/jobs/{small.pk}")
    box = page.get_by_test_id("alignment")
    expect(box).to_contain_text("smaller than the job's minimum")
    expect(box).to_contain_text("40 records (the job needs at least 50 records)")
    expect(box).to_contain_text("1 of 3")
    expect(box.locator("tr", has_text="Why")).to_contain_text("too small")

    # A job that aligns nothing has no such section.
    page.goto(f"/#/jobs/{make_job().pk}")
    page.get_by_test_id("job-state").wait_for()
    expect(page.get_by_role("heading", name="Record alignment")).to_be_hidden()


def test_the_audit_filter_lists_the_alignment_actions_and_reads_their_sizes_as_records(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    job = make_job(
        mode="vertical",
        cuts=["pool1", "pool"],
        mode_options={"join": "sum", "labels": "hospital", "min_records": 50},
        state="scheduled",
    )
    job = services.job_start(job=job)
    alignment_report(
        actor=agent_actor(three_hospitals[0]), job_id=job.pk, digest="ab" * 32, size=40
    )
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/audit")
    filters = page.get_by_test_id("audit-filters")
    offered = page.locator("#audit-actions option").evaluate_all("nodes => nodes.map(n => n.value)")
    for action in ("alignment.agreed", "alignment.mismatch", "alignment.too_small"):
        assert action in offered
    filters.get_by_label(re.compile("^Action", re.I)).fill("alignment.too_small")
    filters.get_by_role("button", name=re.compile("filter|apply|search", re.I)).click()
    page.wait_for_url(re.compile(r"action=alignment\.too_small"))
    rows = page.get_by_test_id("audit-row")
    expect(rows).to_have_count(1)
    expect(rows.first.get_by_test_id("audit-summary")).to_contain_text("size: 40 records")
    expect(rows.first.get_by_test_id("audit-summary")).to_contain_text("minimum: 50 records")
