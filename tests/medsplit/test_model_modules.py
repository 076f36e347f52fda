"""This process's list of model modules: set once as a party starts, it decides which
``MODULE:FACTORY`` models a job's model builds, refusing any other module before it is
imported, with a message naming the module and the setting that would list it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medsplit.errors import ConfigError, ModelModuleRefused
from medsplit.models import model_modules, require_model_module, set_model_modules
from medsplit.models.factory import model_module_names
from medsplit.training.setup import JobModel
from tests.model_modules import ARGS, listed, marked_module


def job_model(name: str) -> JobModel:
    args = '{"in_channels":1,"num_classes":2,"spatial_dims":2}' if ":" in name else ""
    return JobModel(name, 2, 1, 2, (1, 28, 28), seed=5, model_args=args)


def test_none_is_listed_until_a_party_lists_some() -> None:
    assert model_modules().modules == ()
    require_model_module("small_cnn")  # registry models need no listing
    with pytest.raises(
        ModelModuleRefused, match=r"'medsplit.models.small_cnn' .*\(allowed: none\)"
    ):
        require_model_module("medsplit.models.small_cnn:small_cnn")


def test_a_listed_module_builds_the_jobs_model(tmp_path: Path, monkeypatch) -> None:
    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with listed([marked.module]):
        model = job_model(marked.factory).build()
    assert marked.imported()
    # The factory wraps small_cnn: the job's seed gives the registry model's weights.
    want = job_model("small_cnn").build()
    pairs = zip(model.state_dict().values(), want.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert JobModel(marked.factory, 2, 1, 2, (1, 28, 28), 5, str(ARGS)) != job_model(
        marked.factory
    ), "the arguments are part of the model (and of the cache's key)"


def test_an_unlisted_module_is_refused_before_it_is_imported(tmp_path: Path, monkeypatch) -> None:
    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # A listed name that only starts like it allows nothing: packages are dotted.
    with listed([f"{marked.module}x", "monai"], setting="THE_SETTING"):
        for attempt in (require_model_module, lambda name: job_model(name).build()):
            with pytest.raises(ModelModuleRefused) as error:
                attempt(marked.factory)
            assert f"model module {marked.module!r} is not allowed here" in str(error.value)
            assert "to run it here, add it to THE_SETTING" in str(error.value)
    assert not marked.imported()


def test_the_list_is_checked_as_it_is_set() -> None:
    assert model_module_names(" monai.networks , lab.models,,monai.networks") == (
        "monai.networks",
        "lab.models",
    )
    for bad in ("lab.models:net", "lab/models", "2lab", "lab..models"):
        with pytest.raises(ConfigError, match="dotted module names"):
            set_model_modules(bad, setting="S")
    assert model_modules().modules == (), "a refused list changes nothing"
