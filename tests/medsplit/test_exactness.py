"""Invariant 1: split training equals unsplit training bit for bit (torch.equal)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from medsplit.data import DataSplit, iter_batches, synthetic_split
from medsplit.models import build_model
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import hospital_seed
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.training.verify import deterministic, verify_split

SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4)
ADAM = OptimizerConfig(name="adam", lr=1e-3, schedule="step", step_size=5, gamma=0.5)
ADAMW = OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.01, schedule="cosine", total_steps=30)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))


def shares(
    n: int, parts: int, *, shape: tuple[int, ...] = (1, 8, 8), seed: int = 1
) -> list[DataSplit]:
    data = synthetic_split(n * parts, shape=shape, seed=seed)
    return [DataSplit(data.images[i::parts], data.labels[i::parts]) for i in range(parts)]


def assert_exact(
    model: nn.Module, splits: list[DataSplit], config: TrainingConfig, *, min_steps: int = 20
) -> None:
    report = verify_split(model, splits, config)
    assert report.steps >= min_steps
    assert report.exact, f"{report.first_difference} differs by {report.max_abs_difference}"
    assert report.compared == len(model.state_dict())


def test_mlp_matches_hand_written_unsplit_training() -> None:
    """The yardstick here is plain PyTorch, written out, sharing no MedSplit training code."""
    model = mlp()
    data = shares(160, 1)[0]
    config = TrainingConfig(cuts=("2",), client_optimizer=SGD, server_optimizer=SGD, batch_size=8)
    with deterministic():
        job = SplitJob(model, data.images[:2], config)
        job.run([Hospital("only", data)])

        whole = copy.deepcopy(model)
        front = [p for n, p in whole.named_parameters() if n.startswith("1.")]
        back = [p for n, p in whole.named_parameters() if n.startswith("3.")]
        optimizers = [
            torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4) for ps in (front, back)
        ]
        steps = 0
        for x, y in iter_batches(
            data, batch_size=8, seed=hospital_seed(0, 0), epoch=0, drop_last=True
        ):
            nn.functional.cross_entropy(whole(x), y).backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad()
            steps += 1
    assert steps == 20
    got = job.state_dict()
    for name, want in whole.state_dict().items():
        assert torch.equal(got[name], want), name
    assert not torch.equal(got["1.weight"], model.state_dict()["1.weight"]), "nothing trained"


@pytest.mark.parametrize("optimizer", [SGD, ADAM, ADAMW], ids=["sgd", "adam", "adamw"])
def test_each_optimizer_is_exact(optimizer: OptimizerConfig) -> None:
    config = TrainingConfig(
        cuts=("2",), client_optimizer=optimizer, server_optimizer=optimizer, batch_size=8
    )
    assert_exact(mlp(), shares(160, 1), config)


def test_mixed_optimizers_per_party_are_exact() -> None:
    config = TrainingConfig(cuts=("2",), client_optimizer=ADAM, server_optimizer=SGD, batch_size=8)
    assert_exact(mlp(), shares(160, 1), config)


def test_densenet121_cut_after_first_dense_block_is_exact() -> None:
    model = build_model("densenet121", seed=0)
    config = TrainingConfig(
        cuts=("features.denseblock1",),
        client_optimizer=SGD,
        server_optimizer=ADAM,
        batch_size=4,
        max_steps_per_turn=5,
    )
    # Batch norm running statistics are buffers: they are compared too. Five steps (a
    # DenseNet121 step is slow on a CPU) are enough for momentum and Adam's moments to
    # carry state across steps; the optimizers' longer schedules are the MLP tests'.
    assert_exact(model, shares(20, 1, shape=(1, 32, 32)), config, min_steps=5)


def test_skip_connections_crossing_the_cut_are_exact() -> None:
    model = build_model("skip_net", seed=0)
    config = TrainingConfig(
        cuts=("block1",), client_optimizer=ADAM, server_optimizer=SGD, batch_size=8
    )
    job = SplitJob(model, torch.zeros(2, 1, 16, 16), config)
    assert len(job.split.boundaries[0]) == 2, "the skip and the main path must both cross"
    assert_exact(model, shares(160, 1, shape=(1, 16, 16)), config)


def test_ushaped_mode_is_exact() -> None:
    model = build_model("skip_net", seed=0)
    config = TrainingConfig(
        cuts=("block1", "block3"),
        mode="ushaped",
        client_optimizer=ADAMW,
        server_optimizer=SGD,
        batch_size=8,
    )
    assert_exact(model, shares(160, 1, shape=(1, 16, 16)), config)


def test_three_hospitals_round_robin_with_hand_off_are_exact() -> None:
    """Turns in order, weights and optimizer state handed on as bytes, over two rounds."""
    config = TrainingConfig(
        cuts=("2",),
        client_optimizer=ADAM,
        server_optimizer=SGD,
        batch_size=8,
        rounds=2,
        max_steps_per_turn=4,
    )
    assert_exact(mlp(), shares(40, 3), config)


def test_three_hospitals_ushaped_round_robin_are_exact() -> None:
    config = TrainingConfig(
        cuts=("pool1", "pool"),
        mode="ushaped",
        client_optimizer=SGD,
        server_optimizer=ADAM,
        batch_size=8,
        rounds=2,
        max_steps_per_turn=4,
    )
    assert_exact(build_model("small_cnn", seed=0), shares(40, 3, shape=(1, 12, 12)), config)


def test_a_lossy_codec_is_caught_as_not_exact() -> None:
    """The comparison can fail: fp16 on the wire changes the weights, and verify says where."""
    config = TrainingConfig(
        cuts=("2",), client_optimizer=SGD, server_optimizer=SGD, batch_size=8, codec="fp16"
    )
    report = verify_split(mlp(), shares(160, 1), config)
    assert not report.exact
    assert report.first_difference in dict(mlp().named_parameters())
    assert report.max_abs_difference is not None and report.max_abs_difference > 0


def test_a_hand_off_that_drops_optimizer_state_is_caught() -> None:
    """Momentum must travel with the weights; a fresh optimizer at each turn would differ."""
    config = TrainingConfig(
        cuts=("2",), client_optimizer=SGD, server_optimizer=SGD, batch_size=8, max_steps_per_turn=5
    )
    model = mlp()
    splits = shares(40, 2)

    class ForgetfulJob(SplitJob):
        def client_parties(self):  # type: ignore[no-untyped-def]
            parties = super().client_parties()
            for party in parties.values():
                party.optimizer.state.clear()
            return parties

    with deterministic():
        honest = SplitJob(model, splits[0].images[:2], config)
        honest.run([Hospital(f"h{i}", s) for i, s in enumerate(splits)])
        forgetful = ForgetfulJob(model, splits[0].images[:2], config)
        forgetful.run([Hospital(f"h{i}", s) for i, s in enumerate(splits)])
    assert not torch.equal(honest.state_dict()["1.weight"], forgetful.state_dict()["1.weight"])


class InPlaceAfterCut(nn.Module):
    """A layer right after each cut changes its input in place, as DenseNet121's head
    does after ``features.norm5`` (``ReLU(inplace=True)``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.front = nn.Linear(64, 32)
        self.act = nn.ReLU(inplace=True)
        self.middle = nn.Linear(32, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.front(x.flatten(1)))
        h = self.middle(h)
        h += 1.0  # operator.iadd on the middle's output, right after the second cut
        return self.head(h.relu_())


@pytest.mark.parametrize(
    ("mode", "cuts"), [("vanilla", ("front",)), ("ushaped", ("front", "middle"))]
)
def test_a_segment_that_changes_its_input_in_place_trains_exactly(
    mode: str, cuts: tuple[str, ...]
) -> None:
    config = TrainingConfig(
        cuts=cuts, mode=mode, client_optimizer=SGD, server_optimizer=ADAM, batch_size=8
    )
    assert_exact(InPlaceAfterCut(), shares(160, 1), config)


def test_densenet121_at_its_default_ushaped_cuts_is_exact() -> None:
    """Its head begins with an in-place ReLU on the tensor that crosses the second cut."""
    model = build_model("densenet121", seed=0)
    config = TrainingConfig(
        cuts=("features.transition1", "features.norm5"),
        mode="ushaped",
        client_optimizer=SGD,
        server_optimizer=SGD,
        batch_size=2,
        max_steps_per_turn=5,
    )
    assert_exact(model, shares(10, 1, shape=(1, 32, 32)), config, min_steps=5)
