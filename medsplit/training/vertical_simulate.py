"""``medsplit simulate --mode vertical``: parties holding different parts of each image.

Every training image is cut into ``K`` bands of columns (:func:`image_parts`), one per
party, each with an identifier per record. Each party also misses a different tenth of
the records (so that with two parties they share 80 %), and the job aligns them by
private set intersection before the first step. The first party holds the labels.
Validation runs the whole assembled model on the validation split, every party holding
its band of every record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from medsplit.data import DataSplit, load_medmnist, synthetic_split
from medsplit.errors import ConfigError
from medsplit.models import build_any_model
from medsplit.protocol.roles import StepResult
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_length
from medsplit.training.simulate import SimulationSetup, num_classes_of
from medsplit.training.vertical_job import (
    VerticalJob,
    VerticalParty,
    VerticalRoundReport,
    score_vertical,
)
from medsplit.training.vertical_model import build_vertical, image_parts, same_model_parts

#: The share of the records each party lacks (a different share each).
MISSING_SHARE = 0.1


@dataclass(frozen=True)
class VerticalRound:
    """A round's report with the validation of the whole model on the validation split."""

    report: VerticalRoundReport
    validation: dict[str, float]


def vertical_records(
    data: DataSplit, names: list[str], *, missing: float = MISSING_SHARE
) -> list[VerticalParty]:
    """``data`` dealt out as the parties' records: party ``k`` holds band ``k`` of every
    image but a ``missing`` share of its own; the first party holds the labels."""
    if missing * len(names) >= 1:
        raise ConfigError(
            f"{len(names)} parties each missing {missing:.0%} of the records share none"
        )
    identifiers = [f"patient-{i:06d}" for i in range(len(data))]
    bands = image_parts(data.images, len(names))
    gap = int(len(data) * missing)
    out = []
    for k, (name, band) in enumerate(zip(names, bands, strict=True)):
        keep = torch.tensor([i for i in range(len(data)) if not k * gap <= i < (k + 1) * gap])
        out.append(
            VerticalParty(
                name,
                tuple(identifiers[i] for i in keep.tolist()),
                band[keep],
                data.labels[keep] if k == 0 else None,
            )
        )
    return out


def simulate_vertical(
    setup: SimulationSetup,
    config: TrainingConfig,
    *,
    progress: bool = True,
    on_round: Callable[[VerticalRound], None] | None = None,
) -> list[VerticalRound]:
    """A whole vertical job over ``setup.hospitals`` parties in this process.

    Raises:
        ConfigError, CutError, DataError, PsiError: with a message naming what to change.
    """
    if setup.hospitals < 2:
        raise ConfigError("a vertical job needs 2 or more parties (--hospitals)")
    data = setup.data
    if data.medmnist is not None:
        train, val = load_medmnist(data.medmnist, "train"), load_medmnist(data.medmnist, "val")
    else:
        shape, classes = data.synthetic_shape, data.num_classes
        train = synthetic_split(
            data.synthetic_samples, shape=shape, num_classes=classes, seed=config.seed
        )
        val = synthetic_split(
            max(8, data.synthetic_samples // 4),
            shape=shape,
            num_classes=classes,
            seed=config.seed + 1,
        )
    names = [f"hospital-{i + 1}" for i in range(setup.hospitals)]
    model = build_any_model(
        setup.model,
        model_args=setup.model_args,
        spatial_dims=train.images.dim() - 2,
        in_channels=train.images.shape[1],
        num_classes=num_classes_of([train]),
        seed=config.seed,
    )
    built = build_vertical(
        same_model_parts(model, train.images[:2], config.cuts, names),
        mode=config.split_mode,  # type: ignore[arg-type]
        label_party=names[0],
        seed=config.seed,
    )
    job = VerticalJob(built, config, vertical_records(train, names))
    val_inputs = dict(zip(names, image_parts(val.images, len(names)), strict=True))
    total = config.rounds * turn_length(config, len(job.alignment))
    rounds: list[VerticalRound] = []
    with tqdm(total=total, desc="training", unit="step", disable=not progress) as bar:

        def on_step(result: StepResult) -> None:
            bar.update(1)
            bar.set_postfix(round=result.ids.round + 1, loss=f"{result.loss:.4f}")

        def round_done(report: VerticalRoundReport) -> None:
            done = VerticalRound(report, score_vertical(job.trained(), val_inputs, val.labels))
            rounds.append(done)
            if on_round is not None:
                with tqdm.external_write_mode():
                    on_round(done)

        job.run(on_step=on_step, on_round=round_done)
    return rounds
