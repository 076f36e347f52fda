"""Jobs made before the job description get one, from their columns, that trains them
as the columns did; going back gives the columns back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("training", "0007_turn_group")]
AFTER = [("training", "0008_job_description")]
COLUMNS = {
    "model_name": "small_cnn",
    "spatial_dims": 2,
    "in_channels": 1,
    "num_classes": 3,
    "input_shape": [1, 28, 28],
    "mode": "ushaped",
    "cuts": ["pool1", "pool"],
    # As job_create stored it: every field, betas as a list.
    "client_optimizer": {**OptimizerConfig(name="adam", lr=0.002).to_json()},
    # Partial, as a hand-written row might be: the rest takes the defaults.
    "server_optimizer": {"name": "sgd", "momentum": 0.9},
    "batch_size": 16,
    "local_epochs": 2,
    "max_steps_per_turn": 40,
    "rounds": 3,
    "codec": "bf16",
    "seed": 77,
}


def _model(executor: MigrationExecutor, target: list[tuple[str, str]]):
    return executor.loader.project_state(target).apps.get_model("training", "Job")


def test_an_existing_job_gets_the_description_its_columns_held_and_back() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = _model(executor, BEFORE).objects.create(
        name="old", state="running", state_changed_at=timezone.now(), **COLUMNS
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        job = _model(executor, AFTER).objects.get(pk=old.pk)
        described = JobDescription.from_json(job.description)
        # Already normal, every field: version 1 (0010_model_args makes it version 2; it
        # reads as 3, without augmentation).
        assert described.to_json() == {
            **job.description,
            "version": 3,
            "model_args": {},
            "augmentation": [],
        }
        assert described.training_config(f"job-{job.pk}") == TrainingConfig(
            cuts=("pool1", "pool"),
            mode="ushaped",
            client_optimizer=OptimizerConfig(name="adam", lr=0.002),
            server_optimizer=OptimizerConfig(momentum=0.9),
            batch_size=16,
            local_epochs=2,
            max_steps_per_turn=40,
            rounds=3,
            codec="bf16",
            seed=77,
            job=f"job-{job.pk}",
        )
        assert described.job_model().input_shape == (1, 28, 28)
        assert (job.model_name, job.mode, job.rounds) == ("small_cnn", "ushaped", 3)
        assert not hasattr(job, "cuts")

        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        back = _model(executor, BEFORE).objects.get(pk=old.pk)
        for name, value in COLUMNS.items():
            if name != "server_optimizer":
                assert getattr(back, name) == value, name
        assert back.server_optimizer == OptimizerConfig(momentum=0.9).to_json()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
