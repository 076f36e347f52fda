"""A privacy audit of one cut: train the split briefly, then measure what crosses.

1. The split trains for ``train_steps`` steps on the training split, as a one-hospital
   job of its mode would (the front an attacker faces is a trained one, not the initial
   one); where the labels stay at the hospital, the gradients it sends up are scored by
   the label-leakage attacks on the way.
2. The front (evaluation mode, frozen) gives the activations of both splits; an inverse
   network trained on the training pairs reconstructs the validation images (SSIM, PSNR).
3. The distance correlation of validation inputs and activations.

Everything stays in the process; only the numbers of :class:`PrivacyReport` are meant to
leave it. The picture grid, when asked for, goes to the path the caller gives.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from medsplit.channel import InMemoryChannel, RelayKeys
from medsplit.cutting import SplitModel, split_model
from medsplit.data import DataSplit
from medsplit.defenses.distance import distance_correlation
from medsplit.defenses.mechanisms import clip_and_noise, defense_generator
from medsplit.errors import ConfigError, CutError
from medsplit.modes import Side
from medsplit.privacy.inversion import (
    InversionSettings,
    image_quality,
    reconstruct,
    save_picture_grid,
    train_decoder,
)
from medsplit.privacy.leakage import GradientRecorder
from medsplit.protocol.link import LocalLink
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.defended import activation_account, defended_role, job_epsilon
from medsplit.training.label_leakage import LeakageScores
from medsplit.training.schedule import turn_batches
from medsplit.training.setup import client_parties, server_party

__all__ = ["AuditSettings", "FrontExposure", "PrivacyReport", "audit_cut", "audit_front"]

#: The audit's name of the one hospital it simulates.
_HOSPITAL = "audit"


@dataclass(frozen=True)
class AuditSettings:
    """What the audit does besides the job's own training settings.

    Attributes:
        train_steps: split-training steps before measuring (0: the initial front).
        inversion: how the inverse network is trained.
        dcor_records: validation records the distance correlation uses (the first ones).
        max_train_records: training records the decoder learns from (the first ones).
        max_val_records: validation records reconstructed (the first ones).
        picture: where to write the picture grid (PNG); ``None``: no picture.
    """

    train_steps: int = 100
    inversion: InversionSettings = field(default_factory=InversionSettings)
    dcor_records: int = 512
    max_train_records: int = 4096
    max_val_records: int = 1024
    picture: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.train_steps, int) or self.train_steps < 0:
            raise ConfigError(f"train_steps must be an integer >= 0, got {self.train_steps!r}")
        for name in ("dcor_records", "max_train_records", "max_val_records"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise ConfigError(f"{name} must be an integer >= 2, got {value!r}")


@dataclass(frozen=True)
class PrivacyReport:
    """The audit's figures: numbers only, nothing of the data.

    Attributes:
        cut: the cut whose activations were inverted (the mode's first).
        activation: the crossing tensor's per-sample shape.
        ssim, psnr: the reconstructions' mean SSIM and PSNR (dB) on the validation split.
        baseline_ssim, baseline_psnr: the same for the training split's mean image in place
            of every reconstruction (what an attacker gets from the activations if they
            tell it nothing; on alike images, chest X-rays say, it is far above 0).
        distance_correlation: of validation inputs and activations, in [0, 1].
        labels: ``"server"`` when the labels travel (no label-leakage figure: the server
            holds them), ``"hospital"`` otherwise.
        label_leakage: the norm and cosine attacks' AUC and strength (``max(auc,
            1 - auc)``) on the gradients sent up; ``None`` when the labels travel, no
            step trained, or the labels are not binary (``label_leakage_note`` says which).
    """

    model: str
    mode: str
    cuts: tuple[str, ...]
    cut: str
    activation: tuple[int, ...]
    train_steps: int
    train_records: int
    val_records: int
    ssim: float
    psnr: float
    baseline_ssim: float
    baseline_psnr: float
    distance_correlation: float
    dcor_records: int
    labels: str
    label_leakage: dict[str, float | None] | None
    label_leakage_note: str
    picture: str | None = None
    #: The defenses the audited job runs (its privacy options' JSON; ``{}``: none), and
    #: the ε the whole job spends at this hospital with activation noise (``None``: none).
    defenses: dict[str, Any] = field(default_factory=dict)
    epsilon: dict[str, float | int] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["cuts"], out["activation"] = list(self.cuts), list(self.activation)
        return out


def check_one_tensor(split: SplitModel) -> tuple[int, ...]:
    """The per-sample shape of the one tensor crossing the first cut.

    Raises:
        CutError: several tensors cross it (an inverse network takes one).
    """
    crossing = split.boundaries[0]
    if len(crossing) != 1:
        names = ", ".join(t.name for t in crossing)
        raise CutError(
            f"{len(crossing)} tensors cross cut {split.cuts[0]!r} ({names}); the privacy "
            "audit inverts a cut that one tensor crosses (see `medsplit cuts MODEL`)"
        )
    return tuple(crossing[0].shape)


def audit_cut(
    model: torch.nn.Module,
    train: DataSplit,
    val: DataSplit,
    config: TrainingConfig,
    settings: AuditSettings,
    *,
    model_name: str = "",
) -> PrivacyReport:
    """Audit ``model`` cut at ``config.cuts`` on a hospital's ``train`` and ``val`` splits
    (images in [0, 1]); the model itself is left untouched.

    Raises:
        CutError: an unknown cut, or several tensors crossing the first one.
        ConfigError: a vertical mode (its own audit runs every round: `medsplit simulate`),
            a split too small.
        DataError: images outside [0, 1].
    """
    mode = config.split_mode
    if mode.feature_sets:
        raise ConfigError(
            f"the privacy audit runs one front on whole images; a {mode.name} job's parties "
            "hold parts of each record (its label-leakage audit runs every round in "
            "`medsplit simulate --mode vertical`)"
        )
    if len(train) < 2 or len(val) < 2:
        raise ConfigError(
            f"the audit needs at least 2 training and 2 validation records, got "
            f"{len(train)} and {len(val)}"
        )
    split = split_model(model, train.images[:2], config.cuts)
    activation_shape = check_one_tensor(split)
    parties, leakage = _train(split, train, config, settings.train_steps)
    front_name = next(n for n, i in mode.client_segments().items() if i == 0)
    front = parties[front_name].module

    fit = _first(train, settings.max_train_records)
    held = _first(val, settings.max_val_records)
    # The attacker sees what is sent: with activation noise, clipped and noised.
    noise = _sent_noise(config, len(train))
    fit_z = _activations(front, fit.images, noise=noise, seed=config.seed, what="fit")
    held_z = _activations(front, held.images, noise=noise, seed=config.seed, what="held")
    decoder = train_decoder(fit_z, fit.images, settings.inversion)
    rebuilt = reconstruct(decoder, held_z)
    ssim, psnr = image_quality(held.images, rebuilt)
    # What knowing only the average image gets: the floor the figures are read against.
    mean = fit.images.mean(dim=0, keepdim=True).expand_as(held.images)
    baseline_ssim, baseline_psnr = image_quality(held.images, mean)
    n = min(settings.dcor_records, len(held))
    dcor = distance_correlation(held.images[:n], held_z[:n])
    picture = None
    if settings.picture is not None:
        picture = str(save_picture_grid(held.images, rebuilt, settings.picture))

    if mode.labels is not Side.HOSPITAL:
        scores, note = None, "labels travel to the server in this mode: nothing to infer"
    elif leakage is None or not leakage.labels:
        scores, note = None, "no training step, so no gradient was sent"
    else:
        scores = leakage.report()
        binary = scores.get("norm_auc") is not None
        note = (
            "norm and cosine attacks on the gradients sent up at the second cut"
            if binary
            else "the attacks are defined for binary labels with both classes present"
        )
        if not binary:
            scores = None
    return PrivacyReport(
        model=model_name or type(model).__name__,
        mode=mode.name,
        cuts=tuple(config.cuts),
        cut=config.cuts[0],
        activation=activation_shape,
        train_steps=settings.train_steps,
        train_records=len(fit),
        val_records=len(held),
        ssim=ssim,
        psnr=psnr,
        baseline_ssim=baseline_ssim,
        baseline_psnr=baseline_psnr,
        distance_correlation=dcor,
        dcor_records=n,
        labels=mode.labels.value,
        label_leakage=scores,
        label_leakage_note=note,
        picture=picture,
        defenses=config.privacy.to_json(),
        epsilon=spent.to_json() if (spent := job_epsilon(config, len(train))) else None,
    )


def _sent_noise(config: TrainingConfig, records: int) -> tuple[float, float] | None:
    """(clip_norm, noise multiplier) of the job's activation noise at a hospital of
    ``records`` records; ``None`` without it."""
    account = activation_account(config, records, round_=0)
    if account is None or config.privacy.activation_noise is None:
        return None
    return config.privacy.activation_noise.clip_norm, account.noise_multiplier


def _train(
    split: SplitModel, train: DataSplit, config: TrainingConfig, steps: int
) -> tuple[dict[str, Party], LeakageScores | None]:
    """The client parties after ``steps`` steps of a one-hospital job, and the scores of
    what the hospital sent up where its labels shaped it."""
    parties = client_parties(split, config)
    if steps == 0:
        return parties, None
    mode = config.split_mode
    per_epoch = (
        len(train) // config.batch_size
        if config.drop_last
        else math.ceil(len(train) / config.batch_size)
    )
    if per_epoch < 1:
        raise ConfigError(
            f"{len(train)} training records make no batch of {config.batch_size}; "
            "give a smaller --batch-size"
        )
    config = dataclasses.replace(
        config, local_epochs=math.ceil(steps / per_epoch), max_steps_per_turn=steps, rounds=1
    )
    server = mode.server_role(
        server_party(split, config), split, job=config.job, codec=config.codec
    )
    # The job's defenses act as they would in the job (the recorder sees what is sent).
    role = defended_role(
        mode.client_role(parties, split, codec=config.codec),
        parties,
        config,
        records=len(train),
        round_=0,
        classes=int(train.labels.max()) + 1 if len(train) else None,
    )
    client = GradientRecorder(role)
    link = LocalLink(InMemoryChannel(), RelayKeys().streams(config.job, _HOSPITAL))
    for batch in turn_batches(config, train, round_=0, hospital=0):
        link.run_step(client, server, batch.ids, batch.x, batch.y)
    return parties, client.scores


def _first(split: DataSplit, count: int) -> DataSplit:
    return DataSplit(split.images[:count], split.labels[:count])


def _activations(
    front: torch.nn.Module,
    images: torch.Tensor,
    batch: int = 256,
    *,
    noise: tuple[float, float] | None = None,
    seed: int = 0,
    what: str = "",
) -> torch.Tensor:
    """What the front sends for ``images`` (evaluation mode, no gradients); with
    ``noise`` (clip norm, multiplier), clipped and noised as a training step sends them."""
    was = front.training
    front.eval()
    try:
        with torch.no_grad():
            out = []
            for i in range(0, len(images), batch):
                z = next(iter(front(images[i : i + batch]).values()))
                if noise is not None:
                    generator = defense_generator(seed, 0, 0, i, f"audit/{what}")
                    z = clip_and_noise(
                        {"z": z}, clip_norm=noise[0], noise_multiplier=noise[1], generator=generator
                    )["z"]
                out.append(z)
    finally:
        front.train(was)
    return torch.cat(out).detach()


@dataclass(frozen=True)
class FrontExposure:
    """What one given front's activations give away: numbers only (and where the
    picture grid was written, when asked for)."""

    ssim: float
    psnr: float
    baseline_ssim: float
    baseline_psnr: float
    distance_correlation: float
    train_records: int
    val_records: int
    dcor_records: int
    picture: str | None = None


def audit_front(
    front: torch.nn.Module, train: DataSplit, val: DataSplit, settings: AuditSettings
) -> FrontExposure:
    """Invert ``front`` as it stands (a job's trained front, say: nothing is trained
    but the inverse network) on a hospital's ``train`` and ``val`` splits, and measure
    the distance correlation of its validation activations; ``settings.train_steps``
    is not used. The front's one output is the tensor crossing the cut; it is left
    untouched (evaluation mode for the audit, its mode restored).

    Raises:
        ConfigError: fewer than 2 training or validation records.
        DataError: images outside [0, 1].
    """
    if len(train) < 2 or len(val) < 2:
        raise ConfigError(
            f"the audit needs at least 2 training and 2 validation records, got "
            f"{len(train)} and {len(val)}"
        )
    fit = _first(train, settings.max_train_records)
    held = _first(val, settings.max_val_records)
    fit_z, held_z = _activations(front, fit.images), _activations(front, held.images)
    decoder = train_decoder(fit_z, fit.images, settings.inversion)
    rebuilt = reconstruct(decoder, held_z)
    ssim, psnr = image_quality(held.images, rebuilt)
    mean = fit.images.mean(dim=0, keepdim=True).expand_as(held.images)
    baseline_ssim, baseline_psnr = image_quality(held.images, mean)
    n = min(settings.dcor_records, len(held))
    dcor = distance_correlation(held.images[:n], held_z[:n])
    picture = None
    if settings.picture is not None:
        picture = str(save_picture_grid(held.images, rebuilt, settings.picture))
    return FrontExposure(
        ssim=ssim,
        psnr=psnr,
        baseline_ssim=baseline_ssim,
        baseline_psnr=baseline_psnr,
        distance_correlation=dcor,
        train_records=len(fit),
        val_records=len(held),
        dcor_records=n,
        picture=picture,
    )
