"""Jobs made before the job description get one, from their columns, that trains them
as the columns did; going back gives the columns back."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription

pytestmark = pytest.mark.django_db(transaction=True)

VERSION_3 = importlib.import_module("training.migrations.0013_description_version_3")
VERSION_4 = importlib.import_module("training.migrations.0014_description_version_4")

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
        # Already normal, every field: version 1 (0010_model_args makes it version 2,
        # 0013_description_version_3 version 3, 0014_description_version_4 version 4).
        assert described.to_json() == {
            **job.description,
            "version": 4,
            "model_args": {},
            **VERSION_3.ADDED,
            **VERSION_4.ADDED,
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


def test_version_2_descriptions_become_version_3_and_back_unless_they_use_it() -> None:
    before = [("training", "0012_label_leakage")]
    after = [("training", VERSION_3.__name__.rsplit(".", 1)[-1])]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    Job = _model(executor, before)
    description = JobDescription.from_json(
        {
            "version": 3,
            "model": "small_cnn",
            "spatial_dims": 2,
            "in_channels": 1,
            "num_classes": 2,
            "input_shape": [1, 28, 28],
            "cuts": ["pool1"],
        }
    ).to_json()
    description = {
        **{k: v for k, v in description.items() if k not in VERSION_4.ADDED},
        "version": 3,
    }
    stored = {k: v for k, v in description.items() if k not in VERSION_3.ADDED}
    old = Job.objects.create(
        name="old",
        state="draft",
        state_changed_at=timezone.now(),
        model_name="small_cnn",
        mode="vanilla",
        rounds=1,
        description={**stored, "version": 2},
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        job = _model(executor, after).objects.get(pk=old.pk)
        assert job.description == description  # every added field at its default
        assert JobDescription.from_json(job.description).to_json() == {
            **description,
            **VERSION_4.ADDED,
            "version": 4,
        }

        executor = MigrationExecutor(connection)
        executor.migrate(before)
        assert _model(executor, before).objects.get(pk=old.pk).description["version"] == 2

        executor = MigrationExecutor(connection)
        executor.migrate(after)
        using = _model(executor, after).objects.get(pk=old.pk)
        using.description = {**description, "party_models": {"lab": {"model": "tabular_mlp"}}}
        using.save(update_fields=["description"])
        with pytest.raises(RuntimeError, match=r"jobs \[\d+\] use fields of version 3"):
            MigrationExecutor(connection).migrate(before)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_version_3_descriptions_become_version_4_and_back_unless_they_use_privacy() -> None:
    before = [("training", VERSION_3.__name__.rsplit(".", 1)[-1])]
    after = [("training", VERSION_4.__name__.rsplit(".", 1)[-1])]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    Job = _model(executor, before)
    today = JobDescription.from_json(
        {
            "version": 4,
            "model": "small_cnn",
            "spatial_dims": 2,
            "in_channels": 1,
            "num_classes": 2,
            "input_shape": [1, 28, 28],
            "cuts": ["pool1"],
        }
    ).to_json()
    version_3 = {**{k: v for k, v in today.items() if k not in VERSION_4.ADDED}, "version": 3}
    old = Job.objects.create(
        name="old",
        state="draft",
        state_changed_at=timezone.now(),
        model_name="small_cnn",
        mode="vanilla",
        rounds=1,
        description=version_3,
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        job = _model(executor, after).objects.get(pk=old.pk)
        assert job.description == today  # privacy at its default: all off
        using = _model(executor, after).objects.get(pk=old.pk)
        using.description = {**today, "privacy": {"nopeek": {"weight": 0.5}}}
        using.save(update_fields=["description"])
        with pytest.raises(RuntimeError, match=r"jobs \[\d+\] use the privacy options"):
            MigrationExecutor(connection).migrate(before)
        using.description = today
        using.save(update_fields=["description"])
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        assert _model(executor, before).objects.get(pk=old.pk).description == version_3
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
