"""The in-process simulation behind ``medsplit simulate``: a whole job on one machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from medsplit.data import (
    DataSplit,
    load_medmnist,
    shard,
    synthetic_segmentation_split,
    synthetic_split,
)
from medsplit.errors import ConfigError
from medsplit.models import build_any_model, get_model_spec, is_factory_name
from medsplit.models.factory import factory_module
from medsplit.protocol.roles import StepResult
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_length
from medsplit.training.split_job import Hospital, RoundReport, SplitJob
from medsplit.training.tasks import CLASSIFICATION, SEGMENTATION, get_task


@dataclass(frozen=True)
class SimulationData:
    """Where the hospitals' data comes from: a MedMNIST ``.npz`` or synthetic images
    (for ``task`` segmentation, MONAI's discs and their masks:
    :func:`~medsplit.data.synthetic_segmentation_split`)."""

    medmnist: Path | None = None
    synthetic_samples: int = 600
    synthetic_shape: tuple[int, ...] = (1, 28, 28)
    num_classes: int = 2
    task: str = CLASSIFICATION

    def __post_init__(self) -> None:
        if get_task(self.task).name == SEGMENTATION and self.medmnist is not None:
            raise ConfigError(
                "MedMNIST files hold one label per image: a segmentation job's "
                "simulation uses synthetic images with masks (leave out --data)"
            )

    def synthetic(self, n: int, *, seed: int) -> DataSplit:
        """``n`` synthetic samples of the task from ``seed``."""
        make = synthetic_segmentation_split if self.task == SEGMENTATION else synthetic_split
        return make(n, shape=self.synthetic_shape, num_classes=self.num_classes, seed=seed)


@dataclass(frozen=True)
class SimulationSetup:
    """Everything ``medsplit simulate`` needs besides the training config."""

    model: str = "small_cnn"
    hospitals: int = 3
    data: SimulationData = field(default_factory=SimulationData)
    #: Keyword arguments of a ``MODULE:FACTORY`` model.
    model_args: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.hospitals, int) or self.hospitals < 1:
            raise ConfigError(f"hospitals must be at least 1, got {self.hospitals!r}")
        if is_factory_name(self.model):
            factory_module(self.model)
        else:
            get_model_spec(self.model)


def load_hospitals(setup: SimulationSetup, *, seed: int) -> list[Hospital]:
    """Deal the training and validation data out to ``setup.hospitals`` hospitals."""
    data = setup.data
    if data.medmnist is not None:
        train = load_medmnist(data.medmnist, "train")
        val = load_medmnist(data.medmnist, "val")
    else:
        train = data.synthetic(data.synthetic_samples, seed=seed)
        val_n = max(setup.hospitals, data.synthetic_samples // 4)
        val = data.synthetic(val_n, seed=seed + 1)
    trains = shard(train, setup.hospitals, seed=seed)
    vals = shard(val, setup.hospitals, seed=seed)
    return [
        Hospital(f"hospital-{i + 1}", t, v)
        for i, (t, v) in enumerate(zip(trains, vals, strict=True))
    ]


def num_classes_of(splits: list[DataSplit]) -> int:
    """Classes seen in the data (at least two)."""
    return max(2, max(int(s.labels.max()) + 1 for s in splits if len(s)))


def simulate(
    setup: SimulationSetup,
    config: TrainingConfig,
    *,
    progress: bool = True,
    on_round: Callable[[RoundReport], None] | None = None,
) -> list[RoundReport]:
    """Run a whole split-learning job over simulated hospitals in this process.

    Raises:
        ConfigError, CutError, DataError, UnknownModelError: with a message naming the
            setting to change.
    """
    if setup.data.task != config.task:
        raise ConfigError(
            f"the job's task is {config.task} but the simulated data is for {setup.data.task}"
        )
    hospitals = load_hospitals(setup, seed=config.seed)
    sample = hospitals[0].train.images
    # In this process, with the person's own code: any module may be named.
    model = build_any_model(
        setup.model,
        model_args=setup.model_args,
        spatial_dims=sample.dim() - 2,
        in_channels=sample.shape[1],
        num_classes=num_classes_of([h.train for h in hospitals]),
        seed=config.seed,
    )
    job = SplitJob(model, sample[:2], config)
    total = config.rounds * sum(turn_length(config, len(h.train)) for h in hospitals)
    with tqdm(total=total, desc="training", unit="step", disable=not progress) as bar:

        def on_step(result: StepResult) -> None:
            bar.update(1)
            bar.set_postfix(round=result.ids.round + 1, loss=f"{result.loss:.4f}")

        def round_done(report: RoundReport) -> None:
            if on_round is not None:
                # Lift the bar while the round's line is written, then redraw it below.
                with tqdm.external_write_mode():
                    on_round(report)

        return job.run(hospitals, on_step=on_step, on_round=round_done)
