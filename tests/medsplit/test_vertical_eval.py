"""A vertical job's evaluation and prediction through the split equal the unsplit joint
model."""

from __future__ import annotations

import pytest
import torch

from medsplit.channel.memory import InMemoryChannel
from medsplit.training.evaluate import classification_metrics, majority_baseline
from tests.medsplit.vertical_eval_harness import (
    aligned_test_records,
    run_evaluation,
    snapshot,
    unsplit_logits,
    vertical_setup,
)


@pytest.mark.parametrize("labels", ["hospital", "server"])
def test_vertical_evaluation_equals_the_unsplit_model(labels: str) -> None:
    model, parties, _ = vertical_setup(labels, join="concat" if labels == "server" else "sum")
    features, y = aligned_test_records()
    before = snapshot(parties)
    run = run_evaluation(
        InMemoryChannel(), model, parties, features, y, labels_at_server=labels == "server"
    )
    assert not run.errors, run.errors
    assert run.served is not None and not run.served.refused, run.served.refused
    want = unsplit_logits(model, parties, features)
    expected = classification_metrics(want, y)
    expected["val_baseline_accuracy"] = majority_baseline(y, y).accuracy
    # Where the labels are, the logits are made: the label party's head, or the server.
    got = run.outcomes["h1"].logits if labels == "hospital" else torch.cat(run.server._logits)
    assert torch.equal(got, want)
    assert run.outcomes["h2"].logits is None and not run.outcomes["h2"].metrics
    for name in ("val_accuracy", "val_auc", "val_samples", "val_baseline_accuracy"):
        assert run.served.figures[name] == expected[name], name
    assert run.served.records == len(y)
    after = snapshot(parties)
    assert all(torch.equal(before[k], after[k]) for k in before), "an evaluation trained"


@pytest.mark.parametrize("labels", ["hospital", "server"])
def test_vertical_prediction_equals_the_unsplit_model(labels: str) -> None:
    """The label party's logits of a prediction are the unsplit joint model's on the same
    aligned records; no labels travel, no other party gets logits, no weight changes."""
    model, parties, _ = vertical_setup(labels, join="concat" if labels == "server" else "sum")
    features, y = aligned_test_records()
    before = snapshot(parties)
    run = run_evaluation(
        InMemoryChannel(),
        model,
        parties,
        features,
        y,
        labels_at_server=labels == "server",
        predict=True,
    )
    assert not run.errors, run.errors
    assert run.served is not None and run.served.predicted, run.served.refused
    assert run.served.figures is None and run.served.records == len(y)
    assert run.server is not None and not run.server._labels  # no labels came up
    assert torch.equal(run.outcomes["h1"].logits, unsplit_logits(model, parties, features))
    assert run.outcomes["h2"].logits is None and not run.outcomes["h1"].metrics
    after = snapshot(parties)
    assert all(torch.equal(before[k], after[k]) for k in before), "a prediction trained"
