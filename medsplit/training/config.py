"""What a split-training job trains, and how: one config shared by split and unsplit runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from medsplit.defenses import PrivacyOptions, PrivacyOptionsError, privacy_problems
from medsplit.errors import ConfigError
from medsplit.modes import DEFAULT_MODE, Side, SplitMode, get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.augment import Augmentation, check_augmentation
from medsplit.training.tasks import DEFAULT_TASK, LossFn, get_task, loss_name, make_loss

#: Why a job whose parties hold different features of a record cannot augment.
VERTICAL_AUGMENTATION = (
    "augmentation is not available in a mode whose parties hold different features of the "
    "same records: each party would transform its own part of a record, and the parts "
    "would no longer agree"
)

_JOB_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


@dataclass(frozen=True)
class TrainingConfig:
    """A job's training settings.

    Attributes:
        cuts: submodule names to cut after, as many as the mode cuts.
        mode: the name of a registered mode (:mod:`medsplit.modes`).
        client_optimizer: optimizer of the hospitals' segments.
        server_optimizer: optimizer of the server's segment.
        batch_size: samples per step.
        local_epochs: passes over a hospital's data in one turn.
        max_steps_per_turn: stop a turn after this many steps (``None``: no cap).
        rounds: how many times every hospital takes a turn.
        codec: wire codec (``none`` keeps training exact).
        seed: seeds the batch order of every hospital, turn and epoch.
        job: the job id written into every frame.
        drop_last: skip a final short batch (batch norm cannot train on one sample).
        mode_options: the mode's own settings (:meth:`SplitMode.options`); defaults
            filled in, read-only (last, so that positional callers keep their order).
        task: what the job learns, a name of :data:`medsplit.training.tasks.TASKS`.
        loss: a loss of the task (:attr:`~medsplit.training.tasks.TaskSpec.losses`);
            ``""``: the task's default.
        augmentation: MONAI random transforms applied to every training batch, drawn per
            step from the seed (:mod:`medsplit.training.augment`); normalised, parameters
            filled in; empty: none. Not for a mode whose parties hold different features.
        privacy: the measurements and defenses each hospital runs
            (:mod:`medsplit.defenses.options`); all off by default.
    """

    cuts: tuple[str, ...]
    mode: str = DEFAULT_MODE
    client_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    server_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    batch_size: int = 32
    local_epochs: int = 1
    max_steps_per_turn: int | None = None
    rounds: int = 1
    codec: str = "none"
    seed: int = 0
    job: str = "local"
    drop_last: bool = True
    mode_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    task: str = DEFAULT_TASK
    loss: str = ""
    augmentation: Augmentation = field(default=(), hash=False)
    privacy: PrivacyOptions = field(default_factory=PrivacyOptions, hash=False)

    def __post_init__(self) -> None:
        mode = get_mode(self.mode)  # UnknownModeError, a ConfigError, lists the known ones
        object.__setattr__(self, "mode", mode.name)
        options = MappingProxyType(mode.check_options(self.mode_options))
        object.__setattr__(self, "mode_options", options)
        # The options may change the mode's cuts (SplitFed's label placement).
        object.__setattr__(self, "cuts", mode.with_options(options).check_cuts(self.cuts))
        object.__setattr__(self, "augmentation", check_augmentation(self.augmentation))
        if self.augmentation and mode.feature_sets:
            raise ConfigError(VERTICAL_AUGMENTATION)
        if not isinstance(self.privacy, PrivacyOptions):
            raise ConfigError(f"privacy must be a PrivacyOptions, got {self.privacy!r}")
        labels_at_server = self.split_mode.labels == Side.SERVER
        _, reasons = privacy_problems(
            self.privacy.to_json(),
            labels_at_server=labels_at_server,
            feature_sets=mode.feature_sets,
            label_probes=mode.label_probes,
        )
        if reasons:
            raise PrivacyOptionsError(reasons)
        for name in ("batch_size", "local_epochs", "rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_steps_per_turn is not None and self.max_steps_per_turn < 1:
            raise ConfigError(
                f"max_steps_per_turn must be >= 1 or None, got {self.max_steps_per_turn}"
            )
        object.__setattr__(self, "task", get_task(self.task).name)  # ConfigError names them
        loss_name(self.task, self.loss)  # a loss of another task is a ConfigError
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not self.job or not set(self.job) <= _JOB_ID_CHARS or len(self.job) > 128:
            raise ConfigError(
                f"job id must be 1-128 characters of [A-Za-z0-9_.:-], got {self.job!r}"
            )

    @property
    def split_mode(self) -> SplitMode:
        """The job's mode, from the registry, bound to the job's options."""
        return get_mode(self.mode).with_options(self.mode_options)

    def loss_fn(self) -> LossFn:
        """A fresh loss function of the job's task and loss (:func:`make_loss`)."""
        return make_loss(self.task, self.loss)
