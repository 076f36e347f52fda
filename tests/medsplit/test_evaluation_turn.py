"""An evaluation-only turn (medsplit/turns/evaluation.py): the final model scored on a
test set through the split, equal to the unsplit model's scores, learning nothing; and
the metric functions against hand computation."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from medsplit.channel import InMemoryChannel
from medsplit.cutting import split_model
from medsplit.data import DataSplit, synthetic_split
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import classification_metrics, majority_baseline, score
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import ClientOutcome, FrameRefused, ServerOutcome, TurnIds
from medsplit.turns.evaluation import (
    BASELINE_METRIC,
    evaluation_client,
    evaluation_limits,
    evaluation_results,
    evaluation_round,
    evaluation_server,
)
from medsplit.wire import FrameKind
from tests.medsplit.turn_harness import ScriptedHooks
from tests.redis_server import session_keys


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2)
    )


def config_for(mode: str) -> TrainingConfig:
    cuts = ("2",) if mode == "vanilla" else ("2", "4")
    return TrainingConfig(cuts=cuts, mode=mode, batch_size=8, rounds=2, job="job-eval")


def weights(*modules: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for m in modules for t in m.state_dict().values()]


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_an_evaluation_scores_the_split_model_as_unsplit_and_changes_no_weight(mode: str) -> None:
    model, config = mlp(), config_for(mode)
    test = synthetic_split(21, shape=(1, 8, 8), seed=5)  # 3 batches, the last of 5
    train_labels = torch.tensor([1, 1, 0])
    split = split_model(model, test.images[:2], config.cuts)
    server, clients = server_party(split, config), client_parties(split, config)
    ids = TurnIds(config.job, evaluation_round(config.rounds, 1), 0, config.mode)
    channel, streams = InMemoryChannel(), session_keys().streams(config.job, "h0")
    limits = evaluation_limits(config, num_classes=2, test_samples=len(test))
    hooks = ScriptedHooks()
    turn = evaluation_server(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        party=server,
        final_state=export_parties({"server": server}),
        hooks=hooks,
        limits=limits,
        config=config,
        poll_interval=0.05,
        silence_timeout=20,
    )
    client = evaluation_client(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        parties=lambda: client_parties(split, config),
        final_state=export_parties(clients),
        config=config,
        test=test,
        train_labels=train_labels,
        num_classes=2,
        reply_timeout=20,
    )
    before = weights(server.module, *(p.module for p in clients.values()))
    reports = []
    hospital = threading.Thread(target=lambda: reports.append(client.run()), daemon=True)
    hospital.start()
    assert turn.run() == ServerOutcome.COMPLETED
    hospital.join(20)
    assert reports[0].outcome == ClientOutcome.COMPLETED
    # Nothing learnt: the server's party and the hospital's final parties as they were.
    after = weights(turn.party.module, *(p.module for p in client.parties.values()))
    assert len(before) == len(after)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            before, weights(server.module, *(p.module for p in clients.values())), strict=True
        )
    )
    # The same figures as the whole model scored on the same test set.
    segments = [clients["front"].module, server.module]
    if "head" in clients:
        segments.append(clients["head"].module)
    want = score(segments, test)
    got = evaluation_results(hooks.finished[0])
    assert got["accuracy"] == want["val_accuracy"]
    assert got["samples"] == 21
    if "val_auc" in want:
        assert got["auc"] == want["val_auc"]
    assert got["baseline_accuracy"] == int((test.labels == 1).sum()) / 21
    assert hooks.steps_seen == [], "no training step was served"


def test_a_training_frame_in_an_evaluation_is_refused() -> None:
    """A hostile hospital sends activations (a training step) to an evaluation: refused
    before anything runs on it, naming the check."""
    model, config = mlp(), config_for("vanilla")
    test = synthetic_split(8, shape=(1, 8, 8), seed=5)
    split = split_model(model, test.images[:2], config.cuts)
    server = server_party(split, config)
    ids = TurnIds(config.job, evaluation_round(config.rounds, 1), 0, config.mode)
    channel, streams = InMemoryChannel(), session_keys().streams(config.job, "h1")
    turn = evaluation_server(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        party=server,
        final_state=export_parties({"server": server}),
        hooks=ScriptedHooks(),
        limits=evaluation_limits(config, num_classes=2, test_samples=8),
        config=config,
        poll_interval=0.05,
        silence_timeout=20,
    )
    frame = turn.role.handle  # the role itself refuses, whatever the step
    fake = ids.frame(FrameKind.ACTIVATIONS, 0, {"x": torch.zeros(2, 32)})
    with pytest.raises(FrameRejected, match="an evaluation trains nothing"):
        frame(fake)
    assert FrameRefused  # the server turns a refusal into a failed attempt (test_turns)


def test_the_metric_functions_against_hand_computation() -> None:
    # Two classes, four samples; logit differences -1, 2, 0.5, 1 give p(1) = .269, .881,
    # .622, .731 and the predictions 0, 1, 1, 1 against the labels 0, 1, 1, 0: 3 of 4 right.
    logits = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.5], [0.0, 1.0]])
    labels = torch.tensor([0, 1, 1, 0])
    values = classification_metrics(logits, labels)
    assert values["val_accuracy"] == 0.75
    assert values["val_samples"] == 4
    # AUC by hand: of the 2 x 2 (positive, negative) pairs, .881 > .269, .881 > .731,
    # .622 > .269 rank right and .622 < .731 wrong: 3/4 for class 1, the same for class
    # 0 (one against the rest), so the macro mean is 3/4.
    assert values["val_auc"] == 0.75
    # The baseline: the training labels' most common class (1), scored on these labels.
    baseline = majority_baseline(torch.tensor([1, 1, 0]), labels)
    assert (baseline.label, baseline.accuracy) == (1, 2 / 4)
    # A class missing from the labels: no AUC (undefined), accuracy still.
    one_class = classification_metrics(logits[1:3], labels[1:3])
    assert "val_auc" not in one_class and one_class["val_accuracy"] == 1.0
    results = evaluation_results(
        {"val_accuracy": 0.8, "val_loss": 0.3, BASELINE_METRIC: 0.4, "val_samples": 5.0}
    )
    assert results == {"accuracy": 0.8, "baseline_accuracy": 0.4, "samples": 5.0}


def test_the_evaluation_round_lies_past_the_jobs_rounds() -> None:
    assert evaluation_round(3, 1) == 3
    assert evaluation_round(3, 2) == 4
    with pytest.raises(ValueError):
        evaluation_round(3, 0)


def test_an_empty_test_set_splits_into_no_batch() -> None:
    config = config_for("vanilla")
    limits = evaluation_limits(config, num_classes=2, test_samples=0)
    assert (limits.train_steps, limits.eval_steps) == (0, 0)
    assert DataSplit  # imported for the type of a test set
