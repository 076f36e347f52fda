"""SplitFed in process: exact against unsplit training, weighted by samples, the fronts
(and heads) averaged through real secure aggregation, SFLV2's interleaving seeded."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from medsplit.cli import main
from medsplit.data import DataSplit, synthetic_split
from medsplit.errors import ConfigError
from medsplit.modes import GroupServer, ModeOption, get_mode
from medsplit.modes.averaging import weighted_average
from medsplit.modes.splitfed import SplitFedMode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.secagg import FixedPoint, VectorLayout, clear_weighted_sum
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription
from medsplit.training.parallel import InProcessSecureAggregation
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import turn_batches
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.training.verify import deterministic, verify_split

SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4)
SIZES = (24, 40, 56)  # unequal hospitals: the weights matter
CUTS = {"server": ("3",), "hospital": ("3", "5")}


def mlp() -> nn.Module:
    """Three trainable segments; a BatchNorm in the front, so its running statistics are
    averaged and its integer batch count combined too."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 2),
    )


def hospital_splits(sizes: tuple[int, ...] = SIZES) -> list[DataSplit]:
    data = synthetic_split(sum(sizes), shape=(1, 8, 8), seed=4)
    out, start = [], 0
    for n in sizes:
        out.append(DataSplit(data.images[start : start + n], data.labels[start : start + n]))
        start += n
    return out


def config(variant: str, labels: str, *, seed: int = 0, rounds: int = 2) -> TrainingConfig:
    return TrainingConfig(
        cuts=CUTS[labels],
        mode="splitfed",
        mode_options={"variant": variant, "labels": labels},
        client_optimizer=SGD,
        server_optimizer=SGD,
        batch_size=8,
        rounds=rounds,
        max_steps_per_turn=3,
        seed=seed,
    )


@pytest.mark.parametrize("labels", ["server", "hospital"])
@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_splitfed_equals_unsplit_training_bit_for_bit(variant: str, labels: str) -> None:
    """Invariant 1 extended: the split run (frames, hand-off bytes, secure aggregation of
    the fronts and heads) equals whole-model training averaged in the clear."""
    model = mlp()
    report = verify_split(model, hospital_splits(), config(variant, labels))
    assert report.exact, f"{report.first_difference} differs by {report.max_abs_difference}"
    assert report.compared == len(model.state_dict())
    assert report.steps == 2 * (3 + 3 + 3)


def test_the_average_is_weighted_by_each_hospitals_samples() -> None:
    """SFLV1, one round, against a yardstick sharing none of the parallel code: each
    hospital's whole model trained alone, then averaged in float64 by sample counts."""
    model, splits = mlp(), hospital_splits()
    cfg = config("v1", "server", rounds=1)
    with deterministic():
        job = SplitJob(model, splits[0].images[:2], cfg)
        steps = []
        (report,) = job.run(
            [Hospital(f"h{i}", s) for i, s in enumerate(splits)], on_step=steps.append
        )
        alone = [
            train_unsplit(
                model,
                splits,
                cfg,
                job.split,
                batches=turn_batches(cfg, s, round_=0, hospital=i),
            ).state_dict()
            for i, s in enumerate(splits)
        ]
    # The masked fronts up and the aggregate down to each hospital count as traffic.
    secure = job.secure_aggregation([f"h{i}" for i in range(3)])
    assert secure.last_bytes_up > 3 * 8 * (64 * 32 + 32 + 2 * 32)  # 8 bytes a value
    assert report.bytes_up == sum(r.bytes_up for r in steps) + secure.last_bytes_up
    assert report.bytes_down == sum(r.bytes_down for r in steps) + secure.last_bytes_down
    got = job.state_dict()
    fixed, total = FixedPoint(), sum(SIZES)
    for name, value in got.items():
        if not value.is_floating_point():
            assert torch.equal(value, torch.stack([a[name] for a in alone]).amax(0))
            continue
        exact = sum(n * a[name].double() for n, a in zip(SIZES, alone, strict=True)) / total
        assert ((value.double() - exact).abs() <= fixed.error_bound(exact)).all(), name
    # ...and unweighted, the mean would be elsewhere: the weights were used.
    weight = "1.weight"
    mean = torch.stack([a[weight].double() for a in alone]).mean(0)
    assert (got[weight].double() - mean).abs().max() > 100 * fixed.error_bound(mean).max()


def test_secure_aggregation_equals_the_clear_fixed_point_average() -> None:
    generator = torch.Generator().manual_seed(7)
    names = ["h-a", "h-b", "h-c"]
    states = {
        n: {
            "front.w": torch.randn(5, 4, generator=generator),
            "front.b": torch.randn(4, generator=generator) * 3,
            "front.count": torch.tensor(i + 2),
        }
        for i, n in enumerate(names)
    }
    weights = {"h-a": 3, "h-b": 11, "h-c": 7}
    secure = InProcessSecureAggregation("job-1", names)
    got = secure.average(0, states, weights)
    clear = weighted_average([states[n] for n in names], [weights[n] for n in names])
    assert list(got) == list(clear) == ["front.w", "front.b", "front.count"]
    assert all(torch.equal(got[k], clear[k]) for k in got)
    assert torch.equal(got["front.count"], torch.tensor(4))
    # The clear average is secagg's own arithmetic, done by hand here.
    floats = {n: {k: v for k, v in s.items() if k != "front.count"} for n, s in states.items()}
    layout = VectorLayout.of(floats["h-a"])
    ring = clear_weighted_sum(
        [layout.flatten(floats[n]) for n in names], [weights[n] for n in names], FixedPoint()
    )
    by_hand = layout.unflatten(FixedPoint().decode(ring, 21))
    assert all(torch.equal(got[k], by_hand[k]) for k in by_hand)
    # Masked submissions went up, the aggregate came down to each of the three.
    assert secure.last_bytes_up >= 3 * 8 * layout.length
    assert secure.last_bytes_down >= 3 * 8 * layout.length


def test_sflv2_interleaving_is_drawn_from_the_seed() -> None:
    v2 = get_mode("splitfed").with_options({"variant": "v2"})
    lengths = [3, 5, 2]
    order = v2.step_order(lengths, seed=1, round_index=0)
    assert sorted(order) == [0, 0, 0, 1, 1, 1, 1, 1, 2, 2]
    assert order == v2.step_order(lengths, seed=1, round_index=0)
    assert order != v2.step_order(lengths, seed=2, round_index=0)
    assert order != v2.step_order(lengths, seed=1, round_index=1)
    assert order != sorted(order)
    v1 = get_mode("splitfed")
    assert v1.step_order(lengths, seed=1, round_index=0) == sorted(order)
    assert (v1.group_server(), v2.group_server()) == (GroupServer.PER_TURN, GroupServer.SHARED)


def test_sflv2_runs_are_reproducible_from_the_seed() -> None:
    """The same seed, the same interleaving and weights; another seed, other ones."""
    splits = hospital_splits()

    def server_weights(seed: int) -> torch.Tensor:
        cfg = config("v2", "server", seed=seed, rounds=1)
        job = SplitJob(mlp(), splits[0].images[:2], cfg)
        job.run([Hospital(f"h{i}", s) for i, s in enumerate(splits)])
        return job.server_party.module.state_dict()["4.weight"]

    with deterministic():
        first, again = server_weights(0), server_weights(0)
        other = server_weights(5)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_options_are_checked_and_shape_the_mode() -> None:
    mode = get_mode("splitfed")
    assert (mode.cuts, mode.labels.value, mode.runs_on_platform) == (1, "server", True)
    assert mode.with_options({"variant": "v2"}).runs_on_platform is True
    assert mode.check_options({}) == {"variant": "v1", "labels": "server"}
    u = mode.with_options({"labels": "hospital"})
    assert (u.cuts, u.labels.value, u.client_segments()) == (2, "hospital", {"front": 0, "head": 2})
    with pytest.raises(ConfigError, match=r"variant must be one of \['v1', 'v2'\], got 'v3'"):
        mode.check_options({"variant": "v3"})
    with pytest.raises(ConfigError, match=r"splitfed mode has no option 'rounds'"):
        mode.check_options({"rounds": 2})
    with pytest.raises(ConfigError, match=r"needs 2 cut\(s\)"):
        TrainingConfig(cuts=("3",), mode="splitfed", mode_options={"labels": "hospital"})
    with pytest.raises(ConfigError, match=r"vanilla mode has no option 'variant'"):
        TrainingConfig(cuts=("3",), mode_options={"variant": "v1"})
    with pytest.raises(ConfigError, match=r"not one of"):
        ModeOption("x", str, "c", "help", choices=("a", "b"))
    as_json = mode.describe().to_json()
    assert as_json["runs_on_platform"] is True
    assert [o["choices"] for o in as_json["options"]] == [["v1", "v2"], ["server", "hospital"]]
    # One configuration per combination: what the dashboard's form offers (those it runs).
    assert [
        (c["options"], c["cuts"], c["runs_on_platform"]) for c in as_json["configurations"]
    ] == [
        ({"variant": "v1", "labels": "server"}, 1, True),
        ({"variant": "v1", "labels": "hospital"}, 2, True),
        ({"variant": "v2", "labels": "server"}, 1, True),
        ({"variant": "v2", "labels": "hospital"}, 2, True),
    ]
    assert isinstance(SplitFedMode("v2", "hospital").with_options({}), SplitFedMode)
    json.dumps(as_json)


def test_a_job_description_takes_splitfeds_options_and_their_cuts() -> None:
    fields = dict(
        model="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=2,
        input_shape=(1, 28, 28),
        cuts=("pool1", "pool"),
        mode="splitfed",
        mode_options={"variant": "v2", "labels": "hospital"},
    )
    description = JobDescription(**fields)
    assert description.training_config("j").split_mode.cuts == 2
    assert JobDescription.from_json(description.to_json()) == description
    with pytest.raises(ConfigError, match=r"variant must be one of"):
        JobDescription(**{**fields, "mode_options": {"variant": "v9", "labels": "hospital"}})


def test_the_cli_verifies_and_simulates_splitfed(capsys) -> None:
    rc = main(
        [
            "verify",
            "small_cnn",
            "--mode",
            "splitfed",
            "--variant",
            "v2",
            "--labels",
            "hospital",
            "--hospitals",
            "3",
            "--steps",
            "3",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["exact"] is True and report["steps"] == 3
    rc = main(
        [
            "simulate",
            "--mode",
            "splitfed",
            "--variant",
            "v1",
            "--samples",
            "48",
            "--rounds",
            "2",
            "--max-steps-per-turn",
            "1",
            "--json",
        ]
    )
    rounds = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["steps"] for r in rounds] == [3, 3]
    assert main(["verify", "small_cnn", "--variant", "v2", "--steps", "1"]) == 2
    assert "vanilla mode has no option 'variant'" in capsys.readouterr().err
