"""Tasks on the coordinator: ``GET /api/tasks/``, and a segmentation job checked against
its model and its participants' masks, stored and served with its task and metric."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from medsplit.training.tasks import TASKS

pytestmark = pytest.mark.django_db

CUTS = ["model.skip.submodule.down", "model.skip"]


def masks_summary(classes: int = 2) -> dict[str, Any]:
    """A segmentation set's heartbeat summary (hospital_agent.data.local.DataSummary)."""
    return {
        "image_shape": [1, 32, 32],
        "split_sizes": {"train": 16, "val": 4},
        "task": "segmentation",
        "masks": 20,
        "mask_classes": {str(c): 20 - c for c in range(classes)},
    }


@pytest.fixture
def admin(client_for, consortium_admin) -> APIClient:
    return client_for(consortium_admin)


@pytest.fixture
def segmentation_data(job_data, three_hospitals):
    """A valid segmentation job body over three hospitals that report masks."""
    for hospital in three_hospitals:
        hospital.dataset_summary = masks_summary()
        hospital.save(update_fields=["dataset_summary"])

    def make(**overrides: Any) -> dict[str, Any]:
        body = {"model": "unet", "task": "segmentation", "mode": "ushaped", "cuts": CUTS}
        return job_data(**{**body, "max_steps_per_turn": 3, **overrides})

    return make


def test_tasks_list_each_with_its_losses_and_metric(admin, client_for, observer) -> None:
    for client in (admin, client_for(observer)):
        response = client.get("/api/tasks/")
        assert response.status_code == 200, response.content
        assert response.json() == [
            {
                "name": "classification",
                "description": TASKS["classification"].description,
                "losses": ["CrossEntropyLoss"],
                "default_loss": "CrossEntropyLoss",
                "metric": "accuracy",
            },
            {
                "name": "segmentation",
                "description": TASKS["segmentation"].description,
                "losses": ["DiceCELoss", "DiceLoss", "DiceFocalLoss"],
                "default_loss": "DiceCELoss",
                "metric": "dice",
            },
        ]
    assert APIClient().get("/api/tasks/").status_code in (401, 403)


def test_a_segmentation_job_is_stored_and_served_with_its_task_and_metric(
    admin, segmentation_data
) -> None:
    response = admin.post("/api/jobs/", segmentation_data(loss="DiceLoss"), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["task"], job["metric"]) == ("segmentation", "val_dice")
    assert (job["description"]["task"], job["description"]["loss"]) == ("segmentation", "DiceLoss")
    listed = admin.get("/api/jobs/").json()["results"]
    assert [(j["task"], j["metric"]) for j in listed] == [("segmentation", "val_dice")]
    plain = admin.post(
        "/api/jobs/", {**segmentation_data(), "task": "classification"}, format="json"
    )
    assert plain.status_code == 400  # masks at every hospital: not a classification job


def test_a_segmentation_job_is_checked_against_its_model_loss_and_mask_classes(
    admin, segmentation_data, three_hospitals
) -> None:
    def refused(**overrides: Any) -> dict[str, list[str]]:
        response = admin.post("/api/jobs/", segmentation_data(**overrides), format="json")
        assert response.status_code == 400, response.content
        return response.json()["details"]

    # A classifier cannot segment.
    details = refused(model="small_cnn", cuts=["pool1", "pool"])
    assert "a segmentation job needs one of: unet" in " ".join(details["model"])
    # A loss of another task.
    loss = refused(loss="CrossEntropyLoss")["loss"]
    assert "not a loss of the segmentation task" in " ".join(loss)
    # A hospital's masks hold more classes than the job has.
    three_hospitals[1].dataset_summary = masks_summary(classes=3)
    three_hospitals[1].save(update_fields=["dataset_summary"])
    classes = refused(num_classes=2)["num_classes"]
    assert "num_classes must be at least 3, not 2" in " ".join(classes)
