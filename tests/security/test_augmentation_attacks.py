"""A job's augmentation, attacked: it runs on every training image of every step at every
hospital, so a rogue consortium admin (or a coordinator that rewrites a description)
could make the hospitals do unbounded work with it. The coordinator refuses such a job,
and an agent refuses such a description before its turn builds anything."""

from __future__ import annotations

import math
import time

import pytest

from medsplit.training.augment import MAX_TRANSFORMS
from medsplit.training.description import FORMAT, JobDescription, JobDescriptionError
from training.models import Job

DESCRIPTION = {
    "version": FORMAT,
    "model": "small_cnn",
    "spatial_dims": 2,
    "in_channels": 1,
    "num_classes": 2,
    "input_shape": [1, 28, 28],
    "cuts": ["pool1"],
}


def test_an_agent_refuses_a_description_with_endless_or_poisoned_transforms() -> None:
    """What an agent reads from its assignment: a hundred thousand transforms are refused
    at once, naming the limit, without a look at any of them."""
    endless = {**DESCRIPTION, "augmentation": [{"name": "rotate"}] * 100_000}
    started = time.monotonic()
    with pytest.raises(JobDescriptionError) as error:
        JobDescription.from_json(endless)
    assert time.monotonic() - started < 1.0
    assert error.value.problems == {
        "augmentation": [f"at most {MAX_TRANSFORMS} transforms, got 100000"]
    }
    poisoned = [
        {"name": "rotate", "degrees": math.inf},
        {"name": "rotate", "degrees": 10**400},
        {"name": "shift_intensity", "offset": math.nan},
        {"name": {"name": "flip"}},
        {"name": "__class__"},
        {"name": "flip", "axis": -1},
        {"name": "flip", "prob": 10**5000},  # past what Python will write out as text
        {"name": "x" * 100_000},
    ]
    with pytest.raises(JobDescriptionError) as error:
        JobDescription.from_json({**DESCRIPTION, "augmentation": poisoned})
    reasons = error.value.problems["augmentation"]
    assert len(reasons) == len(poisoned), reasons
    assert "unknown transform '__class__'" in reasons[4]
    assert "got a huge integer" in reasons[6] and max(len(r) for r in reasons) < 300


@pytest.mark.django_db
def test_a_rogue_admin_cannot_create_a_job_with_endless_transforms(
    client_for, consortium_admin, job_data
) -> None:
    admin = client_for(consortium_admin)
    body = job_data(augmentation=[{"name": "flip"}] * (MAX_TRANSFORMS + 1))
    response = admin.post("/api/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["details"]["augmentation"] == [
        f"at most {MAX_TRANSFORMS} transforms, got {MAX_TRANSFORMS + 1}"
    ]
    assert not Job.objects.exists()
