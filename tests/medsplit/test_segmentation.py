"""Segmentation in the core: the UNet's cuts, masks as targets, the task's losses, Dice,
the relay's bound on a frame with masks."""

from __future__ import annotations

import pytest
import torch
from monai.losses import DiceCELoss

from medsplit.channel import InMemoryChannel
from medsplit.cutting import cut_table
from medsplit.data import DataSplit, synthetic_segmentation_split
from medsplit.errors import ConfigError, DataError
from medsplit.models import build_model
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.roles import LABELS
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription, JobDescriptionError
from medsplit.training.evaluate import segmentation_metrics
from medsplit.training.reference import train_unsplit
from medsplit.training.relay_limits import relay_limits
from medsplit.training.setup import JobModel, cached_split, client_parties
from medsplit.training.tasks import check_targets, make_loss
from medsplit.training.verify import deterministic, verify_split
from medsplit.turns import ServerOutcome
from medsplit.wire import Frame, FrameKind, FrameMeta, encode_frame
from tests.medsplit.turn_harness import run_over_relay

SHAPE = (1, 32, 32)
ENCODER = "model.skip.submodule.down"  # the UNet's second encoder level


def described(**fields: object) -> dict[str, object]:
    data: dict[str, object] = {
        "version": 3,
        "model": "unet",
        "spatial_dims": 2,
        "in_channels": 1,
        "num_classes": 2,
        "input_shape": list(SHAPE),
        "cuts": [ENCODER],
        "task": "segmentation",
    }
    data.update(fields)
    return data


def test_a_unet_cut_in_its_encoder_trains_ushaped_exactly_as_unsplit() -> None:
    data = synthetic_segmentation_split(16, shape=SHAPE, seed=3)
    splits = [DataSplit(data.images[i::2], data.labels[i::2]) for i in range(2)]
    adam = OptimizerConfig(name="adam", lr=0.01)
    config = TrainingConfig(
        cuts=(ENCODER, "model.skip"),
        mode="ushaped",
        batch_size=4,
        client_optimizer=adam,
        server_optimizer=adam,
        task="segmentation",
    )
    model = build_model("unet", in_channels=1, num_classes=2, seed=0)
    report = verify_split(model, splits, config)
    assert report.steps == 4 and report.exact, report


def test_a_vanilla_turn_over_a_channel_sends_masks_trains_exactly_and_reports_dice() -> None:
    # The masks travel with the activations and the validation logits are (B, 2, H, W):
    # both sides hold them to the job's shape (turn_limits' label_shape).
    data = synthetic_segmentation_split(16, shape=SHAPE, seed=4)
    splits = [DataSplit(data.images[i::2], data.labels[i::2]) for i in range(2)]
    vals = [synthetic_segmentation_split(4, shape=SHAPE, seed=5 + i) for i in range(2)]
    config = TrainingConfig(cuts=(ENCODER,), batch_size=4, task="segmentation", job="seg")
    model = build_model("unet", in_channels=1, num_classes=2, seed=0)
    with deterministic():
        job = run_over_relay(model, splits, config, InMemoryChannel(), vals=vals)
        want = train_unsplit(model, splits, config, job.split).state_dict()
    got = job.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())
    assert job.outcomes == [ServerOutcome.COMPLETED] * 2
    for metrics in job.metrics:
        assert 0.0 <= metrics["val_dice"] <= 1.0 and metrics["val_samples"] == 4
        assert "val_accuracy" not in metrics


def test_the_cut_table_lists_the_skip_tensors_crossing_an_encoder_cut() -> None:
    model = build_model("unet", seed=0)
    rows = {r.name: r for r in cut_table(model, torch.zeros(1, *SHAPE))}
    crossing = [(t.name, t.shape) for t in rows[ENCODER].crossing]
    # The first level's output crosses twice over: on to the second level, and round its
    # skip connection to the first decoder level, so it is sent once, with the second's.
    assert crossing == [("model_down", (16, 16, 16)), ("model_skip_submodule_down", (32, 8, 8))]
    assert rows[ENCODER].values_per_sample == 16 * 16 * 16 + 32 * 8 * 8
    bottom = rows["model.skip.submodule.skip.submodule"]
    assert [t.name for t in bottom.crossing][:2] == ["model_down", "model_skip_submodule_down"]
    assert [t.name for t in rows["model.skip"].crossing] == ["model_skip"]  # all joined


def test_masks_take_one_form_and_must_fit_their_images() -> None:
    images = torch.zeros(3, 1, 8, 8)
    masks = torch.zeros(3, 8, 8, dtype=torch.int64)
    assert DataSplit(images, masks).labels.shape == (3, 1, 8, 8)  # the channel added
    with pytest.raises(DataError, match=r"\(N, 1, 8, 8\) \(a mask per image"):
        DataSplit(images, torch.zeros(3, 1, 8, 7, dtype=torch.int64))
    with pytest.raises(DataError, match="int64"):
        DataSplit(images, masks.float())
    masks[1, 2, 3] = 2
    with pytest.raises(DataError, match=r"hospital.png: masks hold values in \[0, 2\]"):
        check_targets(
            DataSplit(images, masks).labels,
            task="segmentation",
            num_classes=2,
            input_shape=(1, 8, 8),
            where="hospital.png",
        )


def test_a_loss_must_be_one_of_the_tasks() -> None:
    assert JobDescription.problems(described(loss="DiceFocalLoss")) == {}
    problems = JobDescription.problems(described(loss="CrossEntropyLoss"))
    assert list(problems) == ["loss"]
    assert "not a loss of the segmentation task; choose one of DiceCELoss" in problems["loss"][0]
    with pytest.raises(ConfigError, match="not a loss of the classification task"):
        TrainingConfig(cuts=("pool1",), loss="DiceLoss")
    assert isinstance(make_loss("segmentation"), DiceCELoss)  # the default
    problems = JobDescription.problems(described(model="small_cnn", cuts=["pool1"]))
    assert (
        "small_cnn is a classification model; a segmentation job needs one of: unet"
        in (problems["model"][0])
    )
    with pytest.raises(JobDescriptionError):
        JobDescription.from_json(described(task="detection"))
    # Version 2 had no task: read as classification.
    old = {k: v for k, v in described(model="small_cnn", cuts=["pool1"]).items() if k != "task"}
    assert JobDescription.from_json({**old, "version": 2}).task == "classification"


def test_mean_dice_over_foreground_of_a_hand_computed_case() -> None:
    # Sample 0: truth foreground 4 pixels, prediction 2 of them and 2 others:
    # Dice = 2 * 2 / (4 + 4) = 0.5. Sample 1: no foreground in either: Dice 1.
    truth = torch.zeros(2, 1, 4, 4, dtype=torch.int64)
    truth[0, 0, 0, :] = 1
    predicted = torch.zeros(2, 4, 4, dtype=torch.int64)
    predicted[0, 0, :2] = 1
    predicted[0, 1, :2] = 1
    logits = torch.nn.functional.one_hot(predicted, 2).movedim(-1, 1).float()
    values = segmentation_metrics(logits, truth)
    assert values["val_dice"] == pytest.approx((0.5 + 1.0) / 2)
    assert values["val_pixel_accuracy"] == pytest.approx(1 - 4 / 32)
    assert values["val_samples"] == 2.0


def test_the_relay_bound_holds_a_vanilla_frame_with_masks() -> None:
    config = TrainingConfig(cuts=(ENCODER,), batch_size=16, task="segmentation")
    shape = (1, 64, 64)
    split = cached_split(JobModel("unet", 2, 1, 2, shape, 0), config.cuts)
    front = client_parties(split, config)["front"].module
    tensors = {k: v.detach() for k, v in front(torch.rand(16, *shape)).items()}
    tensors[LABELS] = torch.ones(16, 1, 64, 64, dtype=torch.int64)
    meta = FrameMeta("job-1", 0, 0, 0, FrameKind.ACTIVATIONS, config.mode, "none")
    size = len(encode_frame(Frame(meta, tensors)))
    assert size <= relay_limits(split, config, label_shape=(1, 64, 64)).frame_bytes
    assert size > relay_limits(split, config).frame_bytes  # a class index is no mask
