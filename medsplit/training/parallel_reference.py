"""Unsplit training of a parallel mode (SplitFed) over the same batches: the yardstick the
in-process split run, secure aggregation included, must equal exactly.

Every hospital trains the whole model, uncut, on its own batches of the round; the
segments the server would run are, per the mode's
:meth:`~medsplit.modes.SplitMode.group_server`, a copy per hospital (combined with the
mode's :meth:`~medsplit.modes.SplitMode.combine_weighted` after the group) or one set of
weights shared by every hospital's copy of the model, stepped in the mode's
:meth:`~medsplit.modes.SplitMode.step_order`. The hospitals' segments are combined by
``combine_weighted`` in the clear, where the split run aggregates them securely.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.modes import GroupServer, StartFrom
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_batches, turn_length


def train_parallel_unsplit(
    model: torch.nn.Module,
    splits: Sequence[DataSplit],
    config: TrainingConfig,
    split: SplitModel,
    *,
    loss_fn: LossFn | None = None,
) -> torch.nn.Module:
    """Train copies of ``model`` whole, a group's hospitals at once, combining them as the
    job's mode does (its weights per hospital: the hospital's number of samples).

    Returns:
        The combined model after the last round; ``model`` itself is not modified.
    """
    mode = config.split_mode
    loss_fn = loss_fn or config.loss_fn()
    current = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    server_keys = set(split.segments[mode.server_segment].state_dict())
    shared = mode.group_server() == GroupServer.SHARED
    # One server segment for the whole job when shared: its optimizer runs on throughout.
    server_party = _party(current, split, mode.server_segment, config) if shared else None
    for round_ in range(config.rounds):
        for group_index, group in enumerate(mode.plan_round(list(range(len(splits))))):
            if mode.start_from(round_, group_index) == StartFrom.INITIAL:
                current.load_state_dict(initial)
            wholes = [copy.deepcopy(current) for _ in group]
            steppers: list[list[Party]] = []
            for whole in wholes:
                parties = [
                    _party(whole, split, index, config)
                    for index in range(len(split.segments))
                    if not (shared and index == mode.server_segment)
                ]
                if shared:
                    _share(whole, current, server_keys)
                    assert server_party is not None
                    parties.append(server_party)
                steppers.append(parties)
            batches = [turn_batches(config, splits[i], round_=round_, hospital=i) for i in group]
            lengths = [turn_length(config, len(splits[i])) for i in group]
            for position in mode.step_order(lengths, seed=config.seed, round_index=round_):
                batch = next(batches[position])
                loss = loss_fn(wholes[position](batch.x), batch.y)
                loss.backward()
                for party in steppers[position]:
                    party.step()
            weights = [len(splits[i]) for i in group]
            states = [whole.state_dict() for whole in wholes]
            keep = server_keys if shared else set()
            names = [k for k in states[0] if k not in keep]
            combined = mode.combine_weighted([{k: s[k] for k in names} for s in states], weights)
            with torch.no_grad():
                current.load_state_dict({**current.state_dict(), **combined})
    return current


def _party(whole: torch.nn.Module, split: SplitModel, index: int, config: TrainingConfig) -> Party:
    """A party over ``whole``'s parameters of segment ``index``, with that segment's
    optimizer (the server's for the server segment)."""
    params = dict(whole.named_parameters())
    names = [name for name, _ in split.segments[index].named_parameters()]
    server = index == config.split_mode.server_segment
    cfg = config.server_optimizer if server else config.client_optimizer
    return Party.create(torch.nn.ParameterList([params[n] for n in names]), cfg)


def _share(whole: torch.nn.Module, owner: torch.nn.Module, keys: set[str]) -> None:
    """Make ``whole`` use ``owner``'s very tensors (parameters and buffers) for ``keys``,
    so that every hospital's copy trains the one shared server segment."""
    params = dict(owner.named_parameters())
    buffers = dict(owner.named_buffers())
    for key in keys:
        prefix, _, leaf = key.rpartition(".")
        module = whole.get_submodule(prefix)
        if key in params:
            module._parameters[leaf] = params[key]
        elif key in buffers:
            module._buffers[leaf] = buffers[key]
