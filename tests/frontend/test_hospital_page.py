"""The hospital page says what is wrong with a hospital's data: an agent that runs but
cannot use its data, and images a job resizes (which changes what the model sees); and
what a segmentation set holds (its masks by class, not labels)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from hospitals.models import Hospital
from tests.frontend.conftest import screenshot, sign_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_data_problem_and_resized_images_are_shown(
    open_page, consortium_admin, three_hospitals, make_job
) -> None:
    big, broken = three_hospitals[0], three_hospitals[1]
    job = make_job()  # input shape [1, 28, 28]
    Hospital.objects.filter(pk=big.pk).update(
        dataset_summary={**big.dataset_summary, "image_shape": [1, 56, 56]}
    )
    Hospital.objects.filter(pk=broken.pk).update(
        agent_status="data_problem",
        data_problem="breast.npz: cannot be read as a NumPy archive (truncated?)",
        dataset_summary={},
    )
    page = open_page()
    sign_in(page, consortium_admin.username)

    page.goto(f"/#/hospitals/{big.slug}")
    expect(page.get_by_test_id(f"resized-{job.pk}")).to_have_text(
        "Its images (1 × 56 × 56) are resized to the job's 1 × 28 × 28."
    )
    expect(page.get_by_test_id("hospital-dataset")).to_contain_text("1 × 56 × 56")
    screenshot(page, "hospital-resized")

    page.goto(f"/#/hospitals/{broken.slug}")
    problem = page.get_by_test_id("data-problem")
    expect(problem).to_contain_text("breast.npz: cannot be read")
    # No summary is on show as if it were valid, and no resize note without one.
    expect(page.get_by_test_id("hospital-dataset")).not_to_contain_text("Image shape")
    assert page.get_by_test_id(f"resized-{job.pk}").count() == 0
    screenshot(page, "hospital-data-problem")


def test_a_segmentation_set_shows_its_masks_by_class(
    open_page, consortium_admin, three_hospitals
) -> None:
    hospital = three_hospitals[0]
    Hospital.objects.filter(pk=hospital.pk).update(
        dataset_summary={
            "image_shape": [1, 32, 32],
            "split_sizes": {"train": 16, "val": 4},
            "task": "segmentation",
            "masks": 20,
            "mask_classes": {"0": 20, "1": 17, "2": 9},
        }
    )
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/hospitals/{hospital.slug}")
    shown = page.get_by_test_id("hospital-dataset")
    expect(shown).to_contain_text("Masks (segmentation)20")
    expect(shown.locator("table caption")).to_have_text("Masks in which each class appears")
    expect(shown.locator("table:has(caption) tbody tr")).to_have_text(["020", "117", "29"])
    expect(shown).not_to_contain_text("No label counts")
    page.goto("/#/hospitals")
    expect(page.get_by_text("masks by class")).to_be_visible()
    expect(page.get_by_text("0: 20 · 1: 17 · 2: 9")).to_be_visible()
