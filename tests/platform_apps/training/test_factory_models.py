"""Jobs whose model is a ``MODULE:FACTORY`` with model_args: accepted only when the module
is in the coordinator's MEDSPLIT["MODEL_MODULES"] (refused, naming the field and the
setting, before it is imported), built at the participants' shape to check the cuts, its
arguments checked and kept in the description; the cut table endpoint for such a model;
the migration that carries stored descriptions to version 2."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from kernel.errors import InvalidInput
from medsplit.training.description import JobDescription
from tests.model_modules import ARGS, listed, marked_module
from training.apps import MODEL_MODULES_SETTING
from training.models import Job
from training.validation import job_spec_validate

pytestmark = pytest.mark.django_db

FACTORY = "medsplit.models.small_cnn:small_cnn"


def refused(data) -> dict[str, list[str]]:
    with pytest.raises(InvalidInput) as error:
        job_spec_validate(data=data)
    return error.value.details


@pytest.fixture
def coordinator_lists():
    """The coordinator's MEDSPLIT["MODEL_MODULES"], as its training app lists them."""

    def set_(*modules: str):
        return listed(modules, setting=MODEL_MODULES_SETTING)

    return set_


def test_a_factory_in_a_listed_module_is_accepted_and_built_at_the_participants_shape(
    job_data, coordinator_lists
) -> None:
    with coordinator_lists("medsplit.models"):
        spec = job_spec_validate(data=job_data(model=FACTORY, model_args=ARGS))
        assert spec.description.model == FACTORY and dict(spec.description.model_args) == ARGS
        # Its cuts are checked against its own cut table, as a registry model's are.
        details = refused(job_data(model=FACTORY, model_args=ARGS, cuts=["conv9"]))
        assert "unknown cut 'conv9' for medsplit.models.small_cnn:small_cnn" in details["cuts"][0]
        assert "pool1" in details["cuts"][0]
        # The factory's own refusal of its arguments, and a shape its model does not take.
        details = refused(job_data(model=FACTORY, model_args={**ARGS, "depth": 3}))
        assert "refuses the model arguments" in details["model"][0]
        details = refused(job_data(model=FACTORY, model_args={**ARGS, "in_channels": 3}))
        assert "does not fit the participants' data shape [1, 28, 28]" in details["model"][0]
        # Its logits: as many per sample as the job's classes (a registry model is built
        # with num_classes, a factory's arguments decide them).
        details = refused(job_data(model=FACTORY, model_args={**ARGS, "num_classes": 3}))
        assert list(details) == ["num_classes"]
        assert "gives 3 logits per sample, so num_classes is 3, not 2" in details["num_classes"][0]
    with coordinator_lists("torch.nn"):
        conv = {"in_channels": 1, "out_channels": 2, "kernel_size": 3}
        details = refused(job_data(model="torch.nn:Conv2d", model_args=conv, cuts=["x"]))
        assert "gives [2, 2, 26, 26] for a batch of 2, not logits" in details["model"][0]
    assert spec.description.to_json()["model_args"] == ARGS


def test_a_factory_in_a_module_the_coordinator_does_not_list_is_refused_before_import(
    job_data, coordinator_lists, tmp_path: Path, monkeypatch
) -> None:
    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with coordinator_lists("monai"):
        details = refused(job_data(model=marked.factory, model_args=ARGS))
    assert list(details) == ["model"]
    (reason,) = details["model"]
    assert f"model module {marked.module!r} is not one the coordinator lists" in reason
    assert 'MEDSPLIT["MODEL_MODULES"] (MEDSPLIT_MODEL_MODULES) (monai)' in reason
    assert not marked.imported()
    # Listed nowhere (the default): the same, saying none is.
    assert "(none listed)" in refused(job_data(model=FACTORY, model_args=ARGS))["model"][0]


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"model_args": {"channels": 3}}, "model_args", "small_cnn is a registry model"),
        ({"model": FACTORY, "model_args": [1, 2]}, "model_args", "Expected a dictionary"),
        ({"model": FACTORY, "model_args": {"x": "y" * 4100}}, "model_args", "at most 4096"),
        ({"model": "not a:name"}, "model", "is not a model name of the form MODULE:FACTORY"),
        ({"model": "m:" + "f" * 200}, "model", "no more than 200 characters"),
    ],
)
def test_bad_model_args_and_names_are_refused_naming_the_field(
    job_data, coordinator_lists, overrides, field, reason
) -> None:
    with coordinator_lists("medsplit.models", "m"):
        details = refused(job_data(**overrides))
    assert field in details and reason in details[field][0], details


def test_a_factory_too_large_for_the_coordinator_is_refused_unbuilt(
    job_data, coordinator_lists
) -> None:
    """Sized on the meta device: ten billion parameters are never allocated."""
    args = {"in_features": 100_000, "out_features": 100_000}
    with coordinator_lists("torch.nn"):
        details = refused(job_data(model="torch.nn:Linear", model_args=args))
    assert "has 10,000,100,000 parameters" in details["model"][0]


def test_a_module_is_imported_before_the_factory_is_sized_on_the_meta_device(
    job_data, coordinator_lists, tmp_path: Path, monkeypatch
) -> None:
    """A tensor the module makes as it is imported is a real one, not a meta tensor left
    behind by the sizing (its model would then not run at the participants' shape)."""
    (tmp_path / "scaled_models.py").write_text(
        "import torch\n"
        "from medsplit.models.small_cnn import small_cnn\n"
        "SCALE = torch.full((1,), 0.5)\n\n\n"
        "class Scaled(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = small_cnn(spatial_dims=2, in_channels=1, num_classes=2)\n\n"
        "    def forward(self, x):\n"
        "        return self.net(x * SCALE)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "scaled_models", raising=False)
    with coordinator_lists("scaled_models"):
        spec = job_spec_validate(data=job_data(model="scaled_models:Scaled", cuts=["net.pool1"]))
    assert spec.description.model == "scaled_models:Scaled"
    assert not sys.modules["scaled_models"].SCALE.is_meta


def test_the_training_app_lists_the_coordinators_model_modules(job_data, settings) -> None:
    """MEDSPLIT["MODEL_MODULES"] is read when the app starts (here: its ready() again)."""
    from django.apps import apps

    with listed([]):  # put back as it was afterwards
        settings.MEDSPLIT = {**settings.MEDSPLIT, "MODEL_MODULES": ["medsplit.models"]}
        apps.get_app_config("training").ready()
        spec = job_spec_validate(data=job_data(model=FACTORY, model_args=ARGS))
    assert spec.description.model == FACTORY


# -- the API ----------------------------------------------------------------------------


@pytest.fixture
def admin(client_for, consortium_admin) -> APIClient:
    return client_for(consortium_admin)


def test_the_job_api_takes_and_shows_model_args(admin, job_data, coordinator_lists) -> None:
    with coordinator_lists("medsplit.models"):
        response = admin.post("/api/jobs/", job_data(model=FACTORY, model_args=ARGS), "json")
        assert response.status_code == 201, response.content
        shown = admin.get(f"/api/jobs/{response.json()['id']}/").json()
    assert shown["model"] == FACTORY and shown["description"]["model_args"] == ARGS
    created = AuditEvent.objects.get(action="job.created", job_id=shown["id"])
    assert created.details["model"] == FACTORY and created.details["model_args"] == ARGS
    assert JobDescription.from_json(shown["description"]) == Job.objects.get().job_description()
    with coordinator_lists():
        response = admin.post("/api/jobs/", job_data(model=FACTORY, model_args=ARGS), "json")
    assert response.status_code == 400
    assert "MEDSPLIT_MODEL_MODULES" in response.json()["details"]["model"][0]


def test_the_cut_table_of_a_listed_factory(admin, coordinator_lists) -> None:
    url = f"/api/models/{FACTORY}/cuts/"
    query = {"input_shape": "1,28,28", "model_args": '{"spatial_dims": 2, "in_channels": 1}'}
    with coordinator_lists("medsplit.models"):
        body = admin.get(url, query).json()
        assert body["model"] == FACTORY and "pool1" in {row["name"] for row in body["cuts"]}
        again = admin.get(url, query).json()  # from the shared cache
        assert again == body
        no_shape = admin.get(url, {"model_args": "{}"})
        assert no_shape.status_code == 400 and "input_shape" in no_shape.json()["details"]
        bad = admin.get(url, {"input_shape": "1,28,28", "model_args": "[1]"})
        assert bad.status_code == 400 and "JSON object" in bad.json()["details"]["model_args"][0]
        refusal = admin.get(url, {"input_shape": "1,28,28", "model_args": '{"depth": 2}'})
        assert refusal.status_code == 400
        assert "refuses the model arguments" in refusal.json()["details"]["model_args"][0]
        registry = admin.get("/api/models/small_cnn/cuts/", {"model_args": '{"a": 1}'})
        assert registry.status_code == 400 and "model_args" in registry.json()["details"]
    with coordinator_lists():
        unlisted = admin.get(url, query)
    assert unlisted.status_code == 400
    assert "MEDSPLIT_MODEL_MODULES" in unlisted.json()["details"]["model"][0]


# -- the migration ----------------------------------------------------------------------

VERSION_3 = importlib.import_module("training.migrations.0013_description_version_3")
VERSION_4 = importlib.import_module("training.migrations.0014_description_version_4")
BEFORE = [("training", "0009_secure_aggregation")]
AFTER = [("training", "0010_model_args")]


def _model(executor: MigrationExecutor, target: list[tuple[str, str]]):
    return executor.loader.project_state(target).apps.get_model("training", "Job")


@pytest.mark.django_db(transaction=True)
def test_stored_descriptions_become_version_2_and_back(job_data) -> None:
    later = ("model_args", *VERSION_3.ADDED, *VERSION_4.ADDED)  # fields of versions 2-4
    today = job_spec_validate(data=job_data()).description.to_json()
    version_1 = {k: v for k, v in today.items() if k not in later}
    version_1["version"] = 1
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = _model(executor, BEFORE).objects.create(
        name="old",
        state="draft",
        state_changed_at=timezone.now(),
        model_name="small_cnn",
        description=version_1,
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        Later = _model(executor, AFTER)
        job = Later.objects.get(pk=old.pk)
        assert job.description == {**version_1, "version": 2, "model_args": {}}
        assert JobDescription.from_json(job.description) == JobDescription.from_json(version_1)
        factory = Later.objects.create(
            name="factory",
            state="draft",
            state_changed_at=timezone.now(),
            model_name=FACTORY,
            description={**job.description, "model": FACTORY, "model_args": ARGS},
        )
        executor = MigrationExecutor(connection)
        with pytest.raises(RuntimeError, match=rf"jobs \[{factory.pk}\] name MODULE:FACTORY"):
            executor.migrate(BEFORE)
        factory.delete()
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert _model(executor, BEFORE).objects.get(pk=old.pk).description == version_1
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
