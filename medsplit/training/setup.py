"""What the server and every hospital build from a job's description, identically.

Both sides build the job's model from its seed, cut it where the job says and wrap their
segments in parties; so the server's and the hospitals' starting weights are the two
halves of one model, without any weights crossing. A ``MODULE:FACTORY`` model is built
only when its module is in this process's list (:func:`medsplit.models.set_model_modules`),
checked before the module is imported.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from medsplit.cutting import SplitModel, split_model
from medsplit.models import build_model, is_factory_name, model_modules
from medsplit.models.factory import build_factory_model
from medsplit.protocol.party import Party
from medsplit.runtime import release_freed_memory
from medsplit.training.config import TrainingConfig


@dataclass(frozen=True)
class JobModel:
    """The model of a job: its name (a registry model's or ``MODULE:FACTORY``), the shape
    of its inputs, classes and seed; ``model_args``: a factory's keyword arguments as
    canonical JSON (text, so that the model is a cache key)."""

    name: str
    spatial_dims: int
    in_channels: int
    num_classes: int
    input_shape: tuple[int, ...]
    seed: int
    model_args: str = ""

    def build(self) -> torch.nn.Module:
        """The model with its initial weights.

        Raises:
            ModelModuleRefused: a factory whose module this process does not list
                (nothing imported); the message names the module and the setting.
        """
        if is_factory_name(self.name):
            allowed = model_modules()
            return build_factory_model(
                self.name,
                json.loads(self.model_args or "{}"),
                allowed_modules=allowed.modules,
                setting=allowed.setting,
                seed=self.seed,
            )
        return build_model(
            self.name,
            spatial_dims=self.spatial_dims,
            in_channels=self.in_channels,
            num_classes=self.num_classes,
            seed=self.seed,
        )

    def split(self, config: TrainingConfig) -> SplitModel:
        """The model as ``config.cuts`` cut it (traced on a batch of two zero inputs)."""
        return self.split_at(config.cuts)

    def split_at(self, cuts: tuple[str, ...]) -> SplitModel:
        example = torch.zeros(2, *self.input_shape)
        return split_model(self.build(), example, cuts)


@functools.lru_cache(maxsize=8)
def cached_split(model: JobModel, cuts: tuple[str, ...]) -> SplitModel:
    """``model`` cut at ``cuts``, traced once per process (a large network takes seconds).

    Shared between turns: parties take their own copies of the segments
    (:func:`server_party`, :func:`client_parties`), so nothing trains the cached ones.
    """
    return model.split_at(cuts)


@functools.lru_cache(maxsize=8)
def hospital_split(model: JobModel, cuts: tuple[str, ...], held: frozenset[int]) -> SplitModel:
    """``model`` cut at ``cuts`` as a hospital keeps it between turns: the segments
    ``held`` with their initial weights, every other one (the server's) with its
    structure, names and shapes only, on the ``meta`` device.

    A hospital never runs the server's segment (a vanilla DenseNet121's is 26 MB of
    weights it kept for nothing, ``docs/benchmarks.md``); what needs it hold it:
    SplitOut's honest simulation (:func:`hospital_segments`), an export's check, which
    loads the server's weights into a copy (``load_state_dict(..., assign=True)``).
    Traced once per process and key, as :func:`cached_split`; the freed weights are given
    back to the system (``release_freed_memory``), or they would stay resident.
    """
    split = model.split_at(cuts)
    kept = {id(t) for i in held for t in _tensors(split.segments[i])}
    for index, segment in enumerate(split.segments):
        # A tensor shared with a held segment (tied weights) keeps its segment whole.
        if index not in held and not any(id(t) in kept for t in _tensors(segment)):
            segment.to("meta")
    release_freed_memory()
    return split


def hospital_segments(config: TrainingConfig) -> frozenset[int]:
    """The segments a hospital of ``config``'s job needs with their weights: its own,
    and all of them when it simulates honest training (hijacking detection SplitOut)."""
    own = frozenset(config.split_mode.client_segments().values())
    detection = config.privacy.hijack_detection
    if detection is not None and detection.method == "splitout":
        return own | frozenset(role.index for role in config.split_mode.segments())
    return own


def _tensors(module: torch.nn.Module) -> Iterable[torch.Tensor]:
    return itertools.chain(module.parameters(), module.buffers())


def server_party(split: SplitModel, config: TrainingConfig) -> Party:
    """A fresh server party: its own copy of the server segment, with its optimizer."""
    segment = copy.deepcopy(split.segments[config.split_mode.server_segment])
    return Party.create(segment, config.server_optimizer)


def client_parties(split: SplitModel, config: TrainingConfig) -> dict[str, Party]:
    """Fresh hospital parties (those of the mode's client segments), own copies."""
    return {
        name: Party.create(copy.deepcopy(split.segments[index]), config.client_optimizer)
        for name, index in config.split_mode.client_segments().items()
    }
