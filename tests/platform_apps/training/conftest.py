"""Fixtures of the training tests: enrolled hospitals with data summaries, jobs in each
state, and a valid job configuration to vary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hospitals.models import Hospital
from kernel.actors import Actor
from tests.platform_apps.conftest import make_hospital
from training import services
from training.models import Job

SHAPE = [1, 28, 28]


def summary(shape: list[int] | None = None, labels: int = 2) -> dict[str, Any]:
    """A dataset summary as an agent's heartbeat reports it."""
    return {
        "image_shape": shape or SHAPE,
        "label_counts": {str(i): 10 + i for i in range(labels)},
        "split_sizes": {"train": 40, "val": 10},
    }


def report(hospital: Hospital, **kwargs: Any) -> Hospital:
    hospital.dataset_summary = summary(**kwargs)
    hospital.save(update_fields=["dataset_summary"])
    return hospital


@pytest.fixture
def hospital_c(db: None) -> Hospital:
    return report(make_hospital("northside"))


@pytest.fixture
def three_hospitals(hospital_a: Hospital, hospital_b: Hospital, hospital_c: Hospital):
    """Three enrolled hospitals that reported [1, 28, 28] images with labels 0 and 1."""
    report(hospital_a)
    report(hospital_b)
    return [hospital_a, hospital_b, hospital_c]


@pytest.fixture
def job_data(three_hospitals) -> Callable[..., dict[str, Any]]:
    """A valid ``POST /api/jobs/`` body (small_cnn, vanilla); keyword arguments override."""

    def make(**overrides: Any) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": "pneumonia",
            "model": "small_cnn",
            "num_classes": 2,
            "mode": "vanilla",
            "cuts": ["pool1"],
            "client_optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "server_optimizer": {"name": "adam", "lr": 0.001},
            "batch_size": 16,
            "local_epochs": 1,
            "max_steps_per_turn": 20,
            "rounds": 2,
            "codec": "none",
            "seed": 7,
            "on_failure": "retry",
            "max_retries": 1,
            "participants": [{"hospital": h.slug} for h in three_hospitals],
        }
        data.update(overrides)
        return data

    return make


@pytest.fixture
def make_job(job_data, admin_actor: Actor) -> Callable[..., Job]:
    """A job created through the service, then put in ``state`` (test set-up only)."""

    def make(state: str = "draft", **overrides: Any) -> Job:
        job = services.job_create(actor=admin_actor, data=job_data(**overrides))
        if state != job.state:
            Job.objects.filter(pk=job.pk).update(state=state)
            job.refresh_from_db()
        return job

    return make
