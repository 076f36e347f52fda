"""A job's augmentation (medsplit.training.augment): MONAI random transforms drawn per
step from the job's seed, a mask moved with its image, the same draws after a resume,
and training still exact with it on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from medsplit.data import DataSplit, synthetic_split
from medsplit.errors import ConfigError
from medsplit.models import build_model
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.augment import augment_batch, check_augmentation, step_seed
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import job_batches, turn_batches
from medsplit.training.verify import verify_split

EVERY = [
    {"name": "flip"},
    {"name": "rotate90"},
    {"name": "rotate", "degrees": 20},
    {"name": "shift_intensity"},
    {"name": "scale_intensity", "prob": 0.8},
]


def data(n: int = 64, shape: tuple[int, ...] = (1, 12, 12), seed: int = 1) -> DataSplit:
    return synthetic_split(n, shape=shape, seed=seed)


def config(**overrides) -> TrainingConfig:
    values = dict(cuts=("pool1",), batch_size=8, local_epochs=2, augmentation=EVERY)
    return TrainingConfig(**{**values, **overrides})


def test_each_step_draws_from_the_seed_round_hospital_and_step_alone() -> None:
    split, cfg = data(), config()
    first = list(turn_batches(cfg, split, round_=1, hospital=2))
    plain = list(turn_batches(config(augmentation=()), split, round_=1, hospital=2))
    assert len(first) == 16  # two local epochs: the steps go on counting
    for step, (a, p) in enumerate(zip(first, plain, strict=True)):
        want = augment_batch(cfg.augmentation, p.x, p.y, seed=step_seed(0, 1, 2, step))
        assert torch.equal(a.x, want[0]) and torch.equal(a.y, p.y)
        assert not torch.equal(a.x, p.x), "augmentation changed nothing"
    x, y = plain[0].x, plain[0].y
    seeds = [
        step_seed(0, 1, 2, 0),
        step_seed(0, 1, 2, 1),
        step_seed(0, 2, 1, 0),
        step_seed(1, 1, 2, 0),
    ]
    assert len(set(seeds)) == 4
    draws = [augment_batch(cfg.augmentation, x, y, seed=s)[0] for s in seeds]
    assert all(not torch.equal(draws[0], d) for d in draws[1:])


@pytest.mark.parametrize("form", ["N,H,W", "N,1,H,W"])
def test_a_mask_moves_with_its_image_and_stays_class_indices(form: str) -> None:
    x = torch.rand(6, 1, 10, 10)
    mask = torch.randint(0, 3, (6, 10, 10))
    y = mask if form == "N,H,W" else mask.unsqueeze(1)
    flip = check_augmentation([{"name": "flip", "prob": 1.0, "axis": 0}])
    fx, fy = augment_batch(flip, x, y, seed=3)
    assert torch.equal(fx, x.flip(2)) and torch.equal(fy, y.flip(-2))
    ax, ay = augment_batch(check_augmentation(EVERY), x, y, seed=4)
    assert ay.shape == y.shape and ay.dtype == torch.int64
    assert set(ay.unique().tolist()) <= {0, 1, 2}
    assert not torch.equal(ax, x) and not torch.equal(ay, y)
    # Intensity transforms leave a mask as it is.
    shift = check_augmentation([{"name": "shift_intensity", "prob": 1.0, "offset": 0.5}])
    sx, sy = augment_batch(shift, x, y, seed=5)
    assert torch.equal(sy, y) and not torch.equal(sx, x)
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    assert augment_batch(flip, x, labels, seed=3)[1] is labels
    with pytest.raises(ConfigError, match="class labels"):
        augment_batch(flip, x, torch.zeros(6, 2, 10, 10, dtype=torch.int64), seed=3)


def test_a_resumed_turn_draws_the_same_transforms_from_its_step_on() -> None:
    split, cfg = data(), config()
    whole = list(turn_batches(cfg, split, round_=0, hospital=1))
    resumed = list(turn_batches(cfg, split, round_=0, hospital=1, first_step=5))
    assert [b.ids.step for b in resumed] == list(range(5, len(whole)))
    for a, b in zip(whole[5:], resumed, strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_three_hospitals_with_augmentation_train_exactly_as_unsplit() -> None:
    data_all = data(120, seed=2)
    splits = [DataSplit(data_all.images[i::3], data_all.labels[i::3]) for i in range(3)]
    sgd = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)
    cfg = config(
        cuts=("pool1", "pool"),
        mode="ushaped",
        client_optimizer=sgd,
        server_optimizer=sgd,
        local_epochs=1,
        rounds=2,
        max_steps_per_turn=4,
    )
    report = verify_split(build_model("small_cnn", seed=0), splits, cfg, progress=False)
    assert report.steps == 24
    assert report.exact, f"{report.first_difference} differs by {report.max_abs_difference}"
    plain = job_batches(dataclasses.replace(cfg, augmentation=()), splits)
    pairs = zip(job_batches(cfg, splits), plain, strict=True)
    assert all(not torch.equal(a.x, b.x) for a, b in pairs), "the job trained on augmented batches"


def test_augmentation_is_checked_in_the_config() -> None:
    normal = config().augmentation
    assert dict(normal[0]) == {"name": "flip", "prob": 0.5, "axis": 1}
    assert dict(normal[2]) == {"name": "rotate", "prob": 0.5, "degrees": 20.0}
    with pytest.raises(ConfigError, match="unknown transform 'blur'"):
        config(augmentation=[{"name": "blur"}])
    with pytest.raises(ConfigError, match="different features"):
        TrainingConfig(cuts=("pool1", "pool"), mode="vertical", augmentation=[{"name": "flip"}])
    with pytest.raises(ConfigError, match="rotate90 needs square images"):
        augment_batch(normal, torch.rand(2, 1, 8, 10), torch.tensor([0, 1]), seed=0)
