"""The one sequence of batches a job trains on, whether split or not (augmented, when
the job names transforms, with draws seeded per step: :mod:`medsplit.training.augment`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from medsplit.data import DataSplit, iter_batches
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.roles import StepIds
from medsplit.training.augment import augment_batch, step_seed
from medsplit.training.config import TrainingConfig


@dataclass(frozen=True)
class Batch:
    """One step's batch, and where it falls in the job."""

    ids: StepIds
    hospital: int
    x: torch.Tensor
    y: torch.Tensor


def hospital_seed(seed: int, hospital: int) -> int:
    """Each hospital shuffles its own data with its own seed derived from the job's."""
    return seed * 1_000_003 + hospital


def turn_batches(
    config: TrainingConfig,
    split: DataSplit,
    *,
    round_: int,
    hospital: int,
    first_step: int = 0,
) -> Iterator[Batch]:
    """The batches of one hospital's turn in one round, step numbers from 0.

    Each batch is augmented with the job's transforms (``config.augmentation``), seeded
    from ``(config.seed, round_, hospital, step)`` only, so a step's batch is the same
    however the turn got there. ``first_step``: start at that step (a resumed turn),
    skipping the earlier ones without augmenting them.
    """
    step = 0
    for local_epoch in range(config.local_epochs):
        epoch = round_ * config.local_epochs + local_epoch
        for x, y in iter_batches(
            split,
            batch_size=config.batch_size,
            seed=hospital_seed(config.seed, hospital),
            epoch=epoch,
            drop_last=config.drop_last,
        ):
            if config.max_steps_per_turn is not None and step >= config.max_steps_per_turn:
                return
            if step >= first_step:
                if config.augmentation:
                    seed = step_seed(config.seed, round_, hospital, step)
                    x, y = augment_batch(config.augmentation, x, y, seed=seed)
                yield Batch(StepIds(config.job, round_, hospital, step), hospital, x, y)
            step += 1


def turn_length(config: TrainingConfig, samples: int) -> int:
    """Steps in one turn over ``samples`` local samples."""
    per_epoch = samples // config.batch_size
    if not config.drop_last and samples % config.batch_size:
        per_epoch += 1
    steps = per_epoch * config.local_epochs
    return steps if config.max_steps_per_turn is None else min(steps, config.max_steps_per_turn)


def turn_limits(
    config: TrainingConfig,
    *,
    num_classes: int | None,
    train: int,
    val: int,
    label_shape: tuple[int, ...] = (),
) -> FrameLimits:
    """What one hospital's turn may send, from the job and the hospital's split sizes:
    ``T = turn_length(config, train)`` training steps, then ``ceil(val / batch_size)``
    validation batches; ``label_shape``: one sample's target (``()`` a class, ``(1,
    *spatial)`` a mask: ``JobDescription.label_shape``)."""
    return FrameLimits(
        batch_size=config.batch_size,
        exact_batch=config.drop_last,
        num_classes=num_classes,
        train_steps=turn_length(config, train),
        val_samples=val,
        label_shape=tuple(label_shape),
    )


def job_batches(config: TrainingConfig, splits: Sequence[DataSplit]) -> Iterator[Batch]:
    """Every batch of the job: rounds, then hospitals in order (round-robin), then steps."""
    for round_ in range(config.rounds):
        for hospital, split in enumerate(splits):
            yield from turn_batches(config, split, round_=round_, hospital=hospital)
