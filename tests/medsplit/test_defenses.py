"""The defenses (medsplit.defenses): each mechanism does what it states, the accounting is
opacus', and a defended job is reproducible in process and over the relay."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from medsplit.channel import InMemoryChannel
from medsplit.data import DataSplit, synthetic_split
from medsplit.defenses import PrivacyOptions
from medsplit.defenses.accounting import (
    epsilon_spent,
    noise_for_target,
    poisson_bound,
    poisson_rate,
)
from medsplit.defenses.mechanisms import (
    clip_and_noise,
    defense_generator,
    keep_probability,
    per_sample_norms,
    randomised_response,
)
from medsplit.defenses.nopeek import nopeek_outputs, nopeek_penalty
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import job_epsilon
from medsplit.training.schedule import turn_batches, turn_length
from medsplit.training.split_job import Hospital, SplitJob
from tests.medsplit.turn_harness import run_over_relay

SGD = OptimizerConfig(name="sgd", lr=0.05)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2)
    )


def shares(n: int, parts: int) -> list[DataSplit]:
    data = synthetic_split(n * parts, shape=(1, 8, 8), seed=3)
    return [DataSplit(data.images[i::parts], data.labels[i::parts]) for i in range(parts)]


def config(mode: str, privacy: dict, **overrides) -> TrainingConfig:
    cuts = ("2",) if mode in ("vanilla", "splitfed") else ("2", "4")
    values = dict(
        cuts=cuts,
        mode=mode,
        client_optimizer=SGD,
        server_optimizer=SGD,
        batch_size=8,
        rounds=2,
        job="job-defenses",
        privacy=PrivacyOptions.from_json(privacy),
    )
    return TrainingConfig(**{**values, **overrides})


# -- the mechanisms ---------------------------------------------------------------------


def test_every_sample_is_clipped_to_the_bound_and_smaller_ones_are_left_as_they_are() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 3, 4, generator=g) * torch.linspace(0.01, 3, 16).reshape(16, 1, 1)
    b = torch.randn(16, 5, generator=g)
    b[:4] = 0.0
    tensors = {"a": a, "b": b}
    out = clip_and_noise(tensors, clip_norm=1.5, noise_multiplier=0.0, generator=g)
    norms, before = per_sample_norms(out), per_sample_norms(tensors)
    assert bool((norms <= 1.5 * (1 + 1e-6)).all())
    small = before <= 1.5
    assert 0 < int(small.sum()) < 16, "the case needs samples on both sides of the bound"
    assert torch.equal(out["a"][small], a[small]) and torch.equal(out["b"][small], b[small])
    big = ~small
    assert torch.allclose(norms[big], torch.full_like(norms[big], 1.5))


def test_the_noise_has_the_standard_deviation_asked_for() -> None:
    zeros = {"a": torch.zeros(200, 500)}
    out = clip_and_noise(
        zeros, clip_norm=2.0, noise_multiplier=0.7, generator=defense_generator(1, 0, 0, 0, "t")
    )
    std = float(out["a"].std())
    # 100 000 draws: the sample std is within 1 % of sigma * C with overwhelming odds.
    assert abs(std - 1.4) < 0.014, std
    assert abs(float(out["a"].mean())) < 0.01


def test_the_noise_is_the_same_for_the_same_step_and_differs_between_steps() -> None:
    x = {"a": torch.ones(4, 3)}
    one = clip_and_noise(
        x,
        clip_norm=1.0,
        noise_multiplier=1.0,
        generator=defense_generator(5, 1, 2, 3, "activations"),
    )
    again = clip_and_noise(
        x,
        clip_norm=1.0,
        noise_multiplier=1.0,
        generator=defense_generator(5, 1, 2, 3, "activations"),
    )
    other = clip_and_noise(
        x,
        clip_norm=1.0,
        noise_multiplier=1.0,
        generator=defense_generator(5, 1, 2, 4, "activations"),
    )
    assert torch.equal(one["a"], again["a"]) and not torch.equal(one["a"], other["a"])


def test_nopeeks_gradient_is_autograds_of_the_weighted_term_added_to_the_loss() -> None:
    torch.manual_seed(0)
    front = nn.Linear(12, 6).double()
    x = torch.randn(10, 12, dtype=torch.float64)

    def task_loss(a: torch.Tensor) -> torch.Tensor:
        return (a.tanh() ** 2).sum()

    out = nopeek_outputs(x, {"a": front(x)}, 0.7)
    task_loss(out["a"]).backward()
    got = [p.grad.clone() for p in front.parameters()]
    front.zero_grad()
    a = front(x)
    (task_loss(a) + nopeek_penalty(x, {"a": a}, 0.7)).backward()
    want = [p.grad.clone() for p in front.parameters()]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    front.zero_grad()
    task_loss(front(x)).backward()
    assert not torch.equal(front.weight.grad, want[0]), "the term changed nothing"


def test_randomised_response_keeps_labels_at_the_stated_rate_and_flips_uniformly() -> None:
    labels = torch.arange(4).repeat(25_000)
    out = randomised_response(
        labels, classes=4, epsilon=1.0, generator=defense_generator(0, 0, 0, 0, "labels")
    )
    keep = keep_probability(1.0, 4)
    assert keep == math.e / (math.e + 3)
    rate = float((out == labels).double().mean())
    sd = math.sqrt(keep * (1 - keep) / len(labels))
    assert abs(rate - keep) < 4 * sd, (rate, keep)
    flipped = out[(out != labels) & (labels == 0)]
    counts = torch.bincount(flipped, minlength=4)[1:].double()
    assert counts.min() / counts.max() > 0.9, counts


# -- the accounting ---------------------------------------------------------------------


def test_epsilon_is_opacus_rdp_accountants_for_the_same_steps() -> None:
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(300):
        accountant.step(noise_multiplier=1.1, sample_rate=0.02)
    want = accountant.get_epsilon(delta=1e-5)
    got = epsilon_spent(noise_multiplier=1.1, sample_rate=0.02, steps=300, delta=1e-5)
    assert got.epsilon == want and got.delta_total == 1e-5
    assert epsilon_spent(noise_multiplier=1.1, sample_rate=0.02, steps=0, delta=1e-5).epsilon == 0


def test_a_target_epsilon_gives_noise_that_spends_at_most_it() -> None:
    sigma = noise_for_target(target_epsilon=2.0, sample_rate=0.05, steps=200, delta=1e-5)
    spent = epsilon_spent(noise_multiplier=sigma, sample_rate=0.05, steps=200, delta=1e-5)
    assert 1.9 < spent.epsilon <= 2.0


def test_poisson_batches_vary_stay_within_the_bound_and_are_drawn_again_the_same() -> None:
    cfg = config("vanilla", {"activation_noise": {"noise_multiplier": 1.0}})
    data = shares(48, 1)[0]
    sizes = [b.x.shape[0] for b in turn_batches(cfg, data, round_=0, hospital=0)]
    assert len(sizes) == turn_length(cfg, 48) == 6
    assert len(set(sizes)) > 1 and max(sizes) <= poisson_bound(8, 48)
    later = [b.x for b in turn_batches(cfg, data, round_=0, hospital=0, first_step=4)]
    again = [b.x for b in turn_batches(cfg, data, round_=0, hospital=0)][4:]
    assert all(torch.equal(a, b) for a, b in zip(later, again, strict=True))
    assert poisson_rate(8, 48) == 8 / 48


# -- whole jobs -------------------------------------------------------------------------


def _weights(mode: str, privacy: dict) -> dict[str, torch.Tensor]:
    hospitals = [Hospital(f"h{i}", s) for i, s in enumerate(shares(32, 2))]
    job = SplitJob(mlp(), hospitals[0].train.images[:2], config(mode, privacy))
    job.run(hospitals)
    return job.state_dict()


@pytest.mark.parametrize(
    ("mode", "privacy"),
    [
        (
            "vanilla",
            {
                "activation_noise": {"noise_multiplier": 0.5},
                "nopeek": {"weight": 0.5},
                "label_noise": {"epsilon": 1.0},
            },
        ),
        ("ushaped", {"gradient_noise": {"scale": 1.0}, "nopeek": {"weight": 0.5}}),
        ("splitfed", {"activation_noise": {"noise_multiplier": 0.5}}),
    ],
)
def test_two_seeded_defended_jobs_in_process_give_the_same_weights(
    mode: str, privacy: dict
) -> None:
    one, two = _weights(mode, privacy), _weights(mode, privacy)
    plain = _weights(mode, {})
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert any(not torch.equal(one[k], plain[k]) for k in one), "the defense changed nothing"


def test_two_seeded_noised_jobs_over_the_relay_give_the_same_weights_and_their_epsilon() -> None:
    privacy = {"activation_noise": {"target_epsilon": 4.0}, "gradient_noise": {"scale": 0.5}}
    cfg = config("ushaped", privacy)
    splits = shares(32, 2)
    one = run_over_relay(mlp(), splits, cfg, InMemoryChannel())
    two = run_over_relay(mlp(), splits, cfg, InMemoryChannel())
    a, b = one.state_dict(), two.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    whole = job_epsilon(cfg, 32)
    assert whole is not None and whole.epsilon <= 4.0
    assert one.spent[-1] == whole.to_json()
