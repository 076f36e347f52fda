"""The dashboard's privacy parts (issue 22), in Chromium against the live coordinator: the
job page's privacy panel, per hospital and round with what each figure means and its
reference, read live as hospitals report; and the new-job form's privacy options."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.frontend.conftest import screenshot, sign_in
from tests.platform_apps.conftest import agent_actor
from training import services
from training.privacy import privacy_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PRIVACY = {
    "audit": {"every_rounds": 1, "decoder_steps": 20, "records": 64},
    "activation_noise": {"clip_norm": 1.0, "target_epsilon": 8.0, "delta": 1e-5},
}
AUDIT = {
    "ssim": 0.912,
    "psnr": 21.5,
    "baseline_ssim": 0.25,
    "baseline_psnr": 12.0,
    "distance_correlation": 0.873,
    "train_records": 40,
    "val_records": 10,
    "label_records": 64,
    "norm_auc": 0.97,
    "cosine_auc": 0.61,
}
SPENT = {"epsilon": 3.25, "delta_total": 1e-5, "noise_multiplier": 1.2}


def test_the_privacy_panel_shows_each_hospitals_figures_with_their_meaning(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    a, b, _ = three_hospitals
    job = services.job_start(
        job=make_job(state="scheduled", mode="ushaped", cuts=["pool1", "pool"], privacy=PRIVACY)
    )
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    box = page.get_by_test_id("privacy")
    expect(box).to_contain_text("No figures yet")
    meanings = box.get_by_test_id("privacy-meanings")
    for phrase in ("below about 0.3 unrecognisable", "He, Zhang and Lee", "Székely", "NoPeek"):
        expect(meanings).to_contain_text(phrase)
    for phrase in ("0.5 = chance", "ICLR 2022", "Abadi et al.", "Mironov"):
        expect(meanings).to_contain_text(phrase)

    # Two hospitals' reports of round 1 (what their agents POST), read by the polling page.
    privacy_report(actor=agent_actor(b), job_id=job.pk, round_index=0, figures=SPENT)
    privacy_report(actor=agent_actor(a), job_id=job.pk, round_index=0, figures={**AUDIT, **SPENT})
    rows = box.locator("tbody tr")
    expect(rows).to_have_count(2, timeout=10_000)
    first = rows.filter(has_text=a.name)
    for text in ("0.912", "average image 0.250", "21.5", "0.873", "0.970 / 0.610"):
        expect(first).to_contain_text(text)
    expect(first).to_contain_text("3.25 of 8")
    # A hospital that only accounted ε this round: no audit figure, ε shown.
    expect(rows.filter(has_text=b.name)).to_contain_text("––––3.25 of 8")
    screenshot(page, "job-privacy")


def test_the_new_job_form_sends_the_privacy_options_ticked(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    form.get_by_label("Privacy audit at each hospital").check()
    form.get_by_label("Inverse network's steps").fill("50")
    form.get_by_label(re.compile("Noise on activations")).check()
    form.get_by_label(re.compile("Target ε")).fill("4")
    with page.expect_request(
        lambda r: r.method == "POST" and r.url.endswith("/api/jobs/")
    ) as posted:
        page.get_by_test_id("create-job").click()
    sent = json.loads(posted.value.post_data)["privacy"]
    assert sent == {
        "audit": {"every_rounds": 1, "decoder_steps": 50, "records": 1024},
        "activation_noise": {"clip_norm": 1.0, "target_epsilon": 4, "delta": 1e-5},
    }


def test_the_new_job_form_shows_why_a_probe_probability_of_zero_is_refused(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    form.get_by_label("Hijack detection").check()
    form.get_by_label("Method").select_option("splitguard")
    form.get_by_label("Probe probability (splitguard)").fill("0")
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith("/api/jobs/")
    ) as answered:
        page.get_by_test_id("create-job").click()
    assert answered.value.status == 400
    # The server's reason, beside the privacy section, naming the setting and its value.
    expect(page.locator("#privacy-error")).to_have_text(
        "hijack_detection.probe_probability must be a number in (0, 1), got 0"
    )
    expect(page).to_have_url(re.compile(r"#/jobs/new$"))
