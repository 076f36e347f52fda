"""Unsplit training over the same batches: the yardstick split training must equal exactly."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch

from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import Batch, job_batches


def train_unsplit(
    model: torch.nn.Module,
    splits: Sequence[DataSplit],
    config: TrainingConfig,
    split: SplitModel,
    *,
    loss_fn: LossFn | None = None,
    batches: Iterable[Batch] | None = None,
) -> torch.nn.Module:
    """Train a copy of ``model`` whole, on the job's batch sequence (or on ``batches``,
    a part of it: a job that skipped a hospital's turns trained on the others only).

    Each segment's parameters get the optimizer and schedule that segment has in the
    split job (the same per-parameter optimizers), so the two runs apply the same
    arithmetic to every weight.

    Returns:
        The trained copy; ``model`` itself is not modified.
    """
    whole = copy.deepcopy(model)
    params = dict(whole.named_parameters())
    parties = []
    server_segment = config.split_mode.server_segment
    for index, segment in enumerate(split.segments):
        names = [name for name, _ in segment.named_parameters()]
        cfg = config.server_optimizer if index == server_segment else config.client_optimizer
        group = torch.nn.ParameterList([params[n] for n in names])
        parties.append(Party.create(group, cfg))
    loss_fn = loss_fn or config.loss_fn()
    for batch in job_batches(config, splits) if batches is None else batches:
        loss = loss_fn(whole(batch.x), batch.y)
        loss.backward()
        for party in parties:
            party.step()
    return whole
