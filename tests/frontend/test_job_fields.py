"""The dashboard's parts of this session's job fields, in Chromium against the live
coordinator: a vertical job's label-leakage audit on its page and a passive party's own
model in the form (issue 19), the task, its loss and the augmentation in the form and a
segmentation job's Dice on its page (issue 21), and a coordinator without tasks or
augmentations, whose form does not offer them."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.frontend.conftest import screenshot, sign_in
from tests.platform_apps.conftest import agent_actor
from training import services
from training.leakage import leakage_report
from training.models import Job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

VERTICAL = {"join": "sum", "labels": "hospital", "min_records": 50}


def _new_job_form(page):
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    return form


def _posted_job(page, button: str = "create-job") -> dict:
    """Submit the form and return the body it POSTed to /api/jobs/."""
    with page.expect_request(
        lambda r: r.method == "POST" and r.url.endswith("/api/jobs/")
    ) as posted:
        page.get_by_test_id(button).click()
    return json.loads(posted.value.post_data)


def test_a_vertical_jobs_page_shows_its_label_leakage_audit_per_round(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    label_party, second, third = three_hospitals
    job = make_job(
        mode="vertical", cuts=["pool1", "pool"], mode_options=VERTICAL, state="scheduled"
    )
    job = services.job_start(job=job)
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    box = page.get_by_test_id("leakage")
    expect(box).to_contain_text("No audit yet")
    meaning = box.get_by_test_id("leakage-meaning")
    expect(meaning).to_contain_text("0.5 = nothing leaks")
    expect(meaning).to_contain_text("1.0 = the labels are fully recovered")

    # The label party's reports of rounds 1 and 2 (what its agent POSTs), read by the
    # polling page, in round order.
    leakage_report(
        actor=agent_actor(label_party),
        job_id=job.pk,
        round_index=1,
        parties={second.slug: {"records": 86, "norm_auc": 0.03, "cosine_auc": 0.5}},
    )
    leakage_report(
        actor=agent_actor(label_party),
        job_id=job.pk,
        round_index=0,
        parties={
            second.slug: {"records": 86, "norm_auc": 0.97, "cosine_auc": 0.52},
            third.slug: {"records": 86, "norm_auc": 0.71, "cosine_auc": None},
        },
    )
    rows = box.locator("tbody tr")
    expect(rows).to_have_count(3, timeout=10_000)
    expect(rows.nth(0)).to_contain_text(second.name)
    expect(rows.nth(0)).to_contain_text("86")
    expect(rows.nth(0).locator("td").nth(3)).to_have_text("0.970 labels recovered")
    expect(rows.nth(0).locator("td").nth(4)).to_have_text("0.520 about chance")
    expect(rows.nth(1).locator("td").nth(3)).to_have_text("0.710 some leaks")
    expect(rows.nth(1).locator("td").nth(4)).to_have_text("–")  # labels not binary
    expect(rows.nth(2).locator("td").first).to_have_text("2")
    # An AUC near 0 recovers the labels too, read the other way round.
    expect(rows.nth(2).locator("td").nth(3)).to_have_text("0.030 labels recovered")
    screenshot(page, "job-leakage")

    # A job whose parties hold the same features has no such section.
    page.goto(f"/#/jobs/{make_job().pk}")
    page.get_by_test_id("job-state").wait_for()
    expect(page.get_by_role("heading", name="Label leakage")).to_be_hidden()


def _chosen_in_order(page, hospitals) -> list:
    """``hospitals`` ticked in the form, in the form's order (its first: the label party)."""
    for hospital in hospitals:
        page.get_by_test_id(f"participant-{hospital.slug}").check()
    slugs = page.locator("ol.participants li.chosen").evaluate_all(
        "nodes => nodes.map(n => n.dataset.slug)"
    )
    by_slug = {h.slug: h for h in hospitals}
    return [by_slug[slug] for slug in slugs]


def test_the_form_gives_a_passive_party_a_model_of_its_own(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    form = _new_job_form(page)
    form.locator("select[name=mode]").select_option(label="Vertical (sum, labels at home)")
    label_party, second = _chosen_in_order(page, three_hospitals[:2])
    # Its parties cannot transform their parts of a record alike: no augmentation.
    expect(page.get_by_test_id("augmentation-not-here")).to_be_visible()
    expect(page.get_by_test_id("add-transform")).to_be_hidden()
    # Nor masks: a vertical job classifies.
    expect(form.get_by_label("Task", exact=True)).to_be_disabled()
    expect(page.get_by_test_id("task-not-here")).to_be_visible()
    expect(page.get_by_test_id("cut-pool")).to_be_checked(timeout=30_000)
    parties = form.locator("[data-field=party_models]")
    # The label party runs the job's model: only the other one is offered a model.
    expect(parties.locator("[data-party]")).to_have_count(1)
    expect(page.get_by_test_id(f"party-model-{label_party.slug}")).to_have_count(0)
    page.get_by_test_id(f"party-model-{second.slug}").check()
    model = form.locator(f"#f-party-{second.slug}-model")
    expect(model).to_have_value("small_cnn")  # the job's, to start from
    expect(form.locator(f"#f-party-{second.slug}-shape")).to_have_value("1,28,28")
    # Its cut table at its shape, the crossing tensor beside each cut; the job's first cut
    # is chosen where this model has it.
    cut = form.locator(f"#f-party-{second.slug}-cut")
    expect(cut).to_have_value("pool1", timeout=30_000)
    expect(cut.locator("option[value=pool1]")).to_contain_text("[")
    form.locator(f"#f-party-{second.slug}-args").fill("[1]")
    form.locator(f"#f-party-{second.slug}-args").blur()
    expect(parties).to_contain_text("must be a JSON object")
    form.locator(f"#f-party-{second.slug}-args").fill("")
    form.locator(f"#f-party-{second.slug}-args").blur()
    expect(cut).to_have_value("pool1", timeout=30_000)
    # A front whose output does not fit the join: the coordinator's refusal, beside it.
    cut.select_option("pool2")
    body = _posted_job(page)
    assert body["party_models"] == {
        second.slug: {
            "model": "small_cnn",
            "model_args": {},
            "input_shape": [1, 28, 28],
            "cut": "pool2",
        }
    }
    assert body["participants"] == [{"hospital": label_party.slug}, {"hospital": second.slug}]
    assert "augmentation" not in body
    expect(parties.locator("#party_models-error")).to_contain_text("embedding of one shape")
    assert Job.objects.count() == 0
    cut.select_option("pool1")
    screenshot(page, "new-job-party-model")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    assert job.description["party_models"] == {
        second.slug: {
            "model": "small_cnn",
            "model_args": {},
            "input_shape": [1, 28, 28],
            "cut": "pool1",
        }
    }
    expect(page.locator("tr", has_text=f"{second.name}'s model")).to_contain_text(
        "small_cnn, cut after pool1, input [1, 28, 28]"
    )

    # Moved to the top, it holds the labels and runs the job's model: its own is not sent.
    form = _new_job_form(page)
    form.locator("select[name=mode]").select_option(label="Vertical (sum, labels at home)")
    _chosen_in_order(page, [label_party, second])
    page.get_by_test_id(f"party-model-{second.slug}").check()
    while _chosen_in_order(page, [label_party, second])[0] != second:
        page.get_by_role("button", name=f"Move {second.name} up").click()
    expect(page.get_by_test_id(f"party-model-{second.slug}")).to_have_count(0)
    expect(page.get_by_test_id(f"party-model-{label_party.slug}")).not_to_be_checked()
    assert "party_models" not in _posted_job(page)


def test_the_form_sends_the_augmentation_in_order_and_shows_its_refusal_beside_it(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    form = _new_job_form(page)
    page.get_by_test_id(f"participant-{three_hospitals[0].slug}").check()
    expect(page.get_by_test_id("cut-pool1")).to_be_checked(timeout=30_000)
    box = form.locator("[data-field=augmentation]")
    expect(box).to_contain_text("None: the images are used as they are")
    # The transforms as GET /api/augmentations/ lists them, each with its parameters.
    box.get_by_label("Transform to add").select_option("flip")
    expect(box).to_contain_text("mirror the image")
    page.get_by_test_id("add-transform").click()
    box.get_by_label("Transform to add").select_option("rotate")
    page.get_by_test_id("add-transform").click()
    box.get_by_label("Transform to add").select_option("shift_intensity")
    page.get_by_test_id("add-transform").click()
    flip = page.get_by_test_id("transform-0")
    expect(flip.get_by_label("axis")).to_have_value("1")  # its default
    flip.get_by_label("axis").fill("7")
    page.get_by_test_id("transform-2").get_by_label("offset").fill("0.2")
    page.get_by_role("button", name="Remove rotate").click()
    # The coordinator's refusal of an axis the images do not have, beside the field.
    page.get_by_test_id("create-job").click()
    expect(box.locator("#augmentation-error")).to_contain_text("axis")
    flip.get_by_label("axis").fill("0")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    assert job.description["augmentation"] == [
        {"name": "flip", "prob": 0.5, "axis": 0},
        {"name": "shift_intensity", "prob": 0.5, "offset": 0.2},
    ]
    expect(page.locator("tr", has_text="Augmentation")).to_contain_text(
        "flip (axis 0, prob 0.5), then shift_intensity (offset 0.2, prob 0.5)"
    )


def test_a_coordinator_without_tasks_or_augmentations_is_offered_and_sent_neither(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    # An older coordinator, which has neither list (its own 404 body).
    missing = json.dumps({"code": "not_found", "message": "Not found.", "details": {}})
    for path in ("**/api/tasks/", "**/api/augmentations/"):
        page.route(path, lambda route: route.fulfill(status=404, body=missing))
    sign_in(page, consortium_admin.username)
    form = _new_job_form(page)
    page.get_by_test_id(f"participant-{three_hospitals[0].slug}").check()
    expect(page.get_by_test_id("cut-pool1")).to_be_checked(timeout=30_000)
    expect(page.get_by_test_id("task-fields")).to_be_hidden()
    expect(form.locator("[data-field=augmentation]")).to_be_hidden()
    body = _posted_job(page)
    assert not {"task", "loss", "augmentation"} & set(body)


def _masks_at(hospitals) -> None:
    """The hospitals report segmentation sets (a mask per image, two classes)."""
    for hospital in hospitals:
        hospital.dataset_summary = {
            "image_shape": [1, 32, 32],
            "split_sizes": {"train": 16, "val": 4},
            "task": "segmentation",
            "masks": 20,
            "mask_classes": {"0": 20, "1": 19},
        }
        hospital.save(update_fields=["dataset_summary"])


def test_the_form_offers_the_tasks_and_each_ones_losses(
    open_page, consortium_admin, three_hospitals
) -> None:
    _masks_at(three_hospitals)
    page = open_page()
    sign_in(page, consortium_admin.username)
    form = _new_job_form(page)
    task, loss = form.get_by_label("Task", exact=True), form.get_by_label("Loss", exact=True)
    # GET /api/tasks/'s tasks; classification's one loss until hospitals are chosen.
    options = "nodes => nodes.map(n => n.textContent)"
    assert task.locator("option").evaluate_all(options) == ["classification", "segmentation"]
    assert loss.locator("option").evaluate_all(options) == ["CrossEntropyLoss (default)"]
    # Hospitals that hold masks: the task of their data, with its losses and the default.
    form.get_by_label(re.compile("^Model", re.I)).select_option("unet")
    form.locator("select[name=mode]").select_option(label="U-shaped")
    page.get_by_test_id(f"participant-{three_hospitals[0].slug}").check()
    expect(task).to_have_value("segmentation")
    expect(page.get_by_test_id("task-help")).to_contain_text("mean Dice")
    assert loss.locator("option").evaluate_all(options) == [
        "DiceCELoss (default)",
        "DiceLoss",
        "DiceFocalLoss",
    ]
    expect(loss).to_have_value("DiceCELoss")
    loss.select_option("DiceLoss")
    expect(page.get_by_test_id("cut-model.skip")).to_be_checked(timeout=30_000)
    screenshot(page, "new-job-segmentation")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    assert (job.description["task"], job.description["loss"]) == ("segmentation", "DiceLoss")
    expect(page.locator("tr", has_text="Task")).to_contain_text(
        "segmentation, loss DiceLoss (validation Dice)"
    )


def test_a_segmentation_jobs_page_shows_dice_where_a_classifier_shows_accuracy(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    _masks_at(three_hospitals)
    job = make_job(
        model="unet",
        task="segmentation",
        mode="ushaped",
        cuts=["model.skip.submodule.down", "model.skip"],
        state="scheduled",
    )
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    services.turn_record_progress(
        turn=turn, steps=2, samples=16, bytes_up=1000, bytes_down=1000, loss=0.7, final=True
    )
    metrics = {"train_loss": 0.7, "val_dice": 0.8124, "val_loss": 0.41, "val_samples": 4}
    services.turn_finish(turn=turn, metrics=metrics)
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    cell = page.get_by_test_id("validation-cell")
    expect(cell).to_have_text("val Dice 0.812 · loss 0.4100 · 4 samples")
    expect(page.get_by_test_id("validation-heading")).to_have_text("Validation Dice and loss")
    # No majority-class baseline: that is accuracy's.
    expect(page.locator(".chart-note", has_text="majority")).to_have_count(0)
