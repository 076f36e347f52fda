"""Scoring a split model: the segments run one after another, in batches, in eval mode,
give the whole model's metrics, and leave every module's training flag as it was."""

from __future__ import annotations

import torch

from medsplit.cutting import split_model
from medsplit.data import DataSplit, synthetic_split
from medsplit.models import build_model
from medsplit.training.evaluate import classification_metrics, evaluate, score


def _model_and_data() -> tuple[torch.nn.Module, DataSplit]:
    model = build_model("small_cnn", seed=0)
    return model, synthetic_split(40, shape=(1, 28, 28), seed=3)


def test_score_equals_the_whole_models_metrics_whatever_the_batch_size() -> None:
    model, data = _model_and_data()
    split = split_model(model, data.images[:2], "pool1")
    model.eval()
    with torch.no_grad():
        want = classification_metrics(model(data.images), data.labels)
    model.train()
    for batch_size in (3, 256):
        got = score(split.segments, data, batch_size=batch_size)
        assert got.keys() == want.keys() and "val_auc" in got
        assert got["val_accuracy"] == want["val_accuracy"]
        assert got["val_auc"] == want["val_auc"]
        assert abs(got["val_loss"] - want["val_loss"]) < 1e-5
    assert score(split.segments, data)["val_accuracy"] == evaluate(split.segments, data).accuracy


def test_scoring_leaves_training_flags_and_weights_as_they_were() -> None:
    model, data = _model_and_data()
    split = split_model(model, data.images[:2], "pool1")
    split.segments[1].eval()  # a mix of flags, each restored as it was
    before = {m: m.training for s in split.segments for m in s.modules()}
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    score(split.segments, data, batch_size=7)
    assert {m: m.training for s in split.segments for m in s.modules()} == before
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())


def test_an_empty_split_scores_no_samples() -> None:
    model, _ = _model_and_data()
    split = split_model(model, torch.zeros(2, 1, 28, 28), "pool1")
    empty = DataSplit(torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long))
    assert score(split.segments, empty) == {"val_samples": 0.0}


def test_the_majority_baseline_is_the_training_majoritys_share_of_the_evaluated_labels() -> None:
    from medsplit.training.evaluate import majority_baseline

    baseline = majority_baseline(torch.tensor([1, 1, 0, 1]), torch.tensor([0, 1, 0, 0]))
    assert (baseline.label, baseline.accuracy) == (1, 0.25)
    assert baseline.describe() == "majority-class baseline 0.250 (always class 1)"
    tie = majority_baseline(torch.tensor([[2], [0]]), torch.tensor([0, 0, 2]))
    assert (tie.label, tie.accuracy) == (0, 2 / 3)  # the smaller class of a tie
    assert majority_baseline(torch.tensor([0]), torch.tensor([], dtype=torch.long)).accuracy == 0
