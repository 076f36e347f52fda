"""The one sequence of batches a job trains on, whether split or not (augmented, when
the job names transforms, with draws seeded per step: :mod:`medsplit.training.augment`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from medsplit.data import DataSplit, iter_batches
from medsplit.defenses.accounting import poisson_bound, poisson_rate
from medsplit.defenses.mechanisms import defense_generator
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
    if config.privacy.activation_noise is not None:
        yield from _poisson_batches(
            config, split, round_=round_, hospital=hospital, first_step=first_step
        )
        return
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


#: Draws of one step before giving up (each is empty or too large with chance < 1e-9).
_MOST_DRAWS = 64


def poisson_indices(
    config: TrainingConfig, records: int, *, round_: int, hospital: int, step: int
) -> torch.Tensor:
    """The records of one step under Poisson sampling: each is in with probability
    ``q = batch_size / records``, drawn from a generator seeded by the job's seed and the
    step. A draw that is empty or holds more than :func:`poisson_bound` records is drawn
    again (the accounting adds that chance to δ: :mod:`medsplit.defenses.accounting`)."""
    q = poisson_rate(config.batch_size, records)
    bound = poisson_bound(config.batch_size, records)
    for attempt in range(_MOST_DRAWS):
        generator = defense_generator(config.seed, round_, hospital, step, f"sample/{attempt}")
        chosen = (torch.rand(records, generator=generator) < q).nonzero().flatten()
        if 1 <= len(chosen) <= bound:
            return chosen
    raise RuntimeError(f"{_MOST_DRAWS} Poisson draws of step {step} were all empty or too large")


def _poisson_batches(
    config: TrainingConfig, split: DataSplit, *, round_: int, hospital: int, first_step: int
) -> Iterator[Batch]:
    # As many steps as the turn would have with fixed batches: the accountant's steps.
    for step in range(first_step, turn_length(config, len(split))):
        idx = poisson_indices(config, len(split), round_=round_, hospital=hospital, step=step)
        x, y = split.images[idx], split.labels[idx]
        if config.augmentation:
            seed = step_seed(config.seed, round_, hospital, step)
            x, y = augment_batch(config.augmentation, x, y, seed=seed)
        yield Batch(StepIds(config.job, round_, hospital, step), hospital, x, y)


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
    poisson = config.privacy.activation_noise is not None and train > 0
    return FrameLimits(
        batch_size=config.batch_size,
        exact_batch=config.drop_last and not poisson,
        max_batch=poisson_bound(config.batch_size, train) if poisson else None,
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
