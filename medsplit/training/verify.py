"""Check a cut before launching a job: split and unsplit training must agree bit for bit."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tqdm import tqdm

from medsplit.data import DataSplit
from medsplit.protocol.roles import LossFn
from medsplit.training.config import TrainingConfig
from medsplit.training.parallel import is_parallel
from medsplit.training.parallel_reference import train_parallel_unsplit
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import Batch, job_batches, turn_length
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.training.vertical_job import VerticalJob, VerticalParty
from medsplit.training.vertical_model import (
    build_vertical,
    image_parts,
    same_model_parts,
    train_vertical_unsplit,
)


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify_split`.

    Attributes:
        exact: every parameter and buffer is identical (``torch.equal``).
        compared: how many tensors were compared.
        steps: training steps taken by each run.
        first_difference: the first tensor (in state-dict order) that differs, if any.
        max_abs_difference: the largest difference in that tensor.
    """

    exact: bool
    compared: int
    steps: int
    first_difference: str | None = None
    max_abs_difference: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "exact": self.exact,
            "compared": self.compared,
            "steps": self.steps,
            "first_difference": self.first_difference,
            "max_abs_difference": self.max_abs_difference,
        }


@contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic kernels for the duration, then the caller's setting back."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def verify_split(
    model: torch.nn.Module,
    splits: Sequence[DataSplit],
    config: TrainingConfig,
    *,
    loss_fn: LossFn | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Train ``model`` split (through encoded frames and hand-offs) and whole, then compare.

    Both runs start from ``model``'s weights and see the same batches in the same order
    with the same per-parameter optimizers; with codec ``none`` they must agree exactly.
    A parallel mode (SplitFed) is held to :func:`train_parallel_unsplit`, its split run
    combining the hospitals' segments by secure aggregation, the reference in the clear.
    With ``progress``, a bar on stderr counts both runs' steps.
    """
    example = splits[0].images[:2]
    loss_fn = loss_fn or config.loss_fn()  # one for both runs: the task's
    per_run = config.rounds * sum(turn_length(config, len(s)) for s in splits)
    bar = tqdm(total=2 * per_run, desc="verifying", unit="step", disable=not progress)

    def counted(batches: Iterator[Batch]) -> Iterator[Batch]:
        for batch in batches:
            yield batch
            bar.update(1)

    # Both runs draw from one random stream, from the same seed (dropout, drop-connect):
    # in one process the segments draw in the model's order.
    with deterministic(), bar, torch.random.fork_rng(devices=[]):
        bar.set_postfix(run="split")
        job = SplitJob(model, example, config, loss_fn=loss_fn)
        hospitals = [Hospital(f"hospital-{i}", s) for i, s in enumerate(splits)]
        torch.manual_seed(config.seed)
        steps = sum(r.steps for r in job.run(hospitals, on_step=lambda _: bar.update(1)))
        bar.set_postfix(run="unsplit")
        torch.manual_seed(config.seed)
        if is_parallel(job.mode, len(splits)):
            reference = train_parallel_unsplit(model, splits, config, job.split, loss_fn=loss_fn)
            bar.update(per_run)
        else:
            # The very batches train_unsplit would take by itself, counted as they go.
            batches = counted(job_batches(config, splits))
            reference = train_unsplit(
                model, splits, config, job.split, loss_fn=loss_fn, batches=batches
            )
    return compare_states(job.state_dict(), reference.state_dict(), steps)


def compare_states(
    got: Mapping[str, torch.Tensor], want_all: Mapping[str, torch.Tensor], steps: int
) -> VerifyReport:
    """Every tensor of ``want_all`` against ``got`` with ``torch.equal``: the report."""
    extra = sorted(set(got) - set(want_all))
    if extra:
        return VerifyReport(False, len(want_all), steps, extra[0])
    for name, want in want_all.items():
        have = got.get(name)
        if have is None or have.shape != want.shape or not torch.equal(have, want):
            diff = None
            if have is not None and have.shape == want.shape and want.is_floating_point():
                diff = float((have.double() - want.double()).abs().max())
            return VerifyReport(False, len(want_all), steps, name, diff)
    return VerifyReport(True, len(want_all), steps)


def verify_vertical(
    model: torch.nn.Module,
    data: DataSplit,
    config: TrainingConfig,
    *,
    parties: int,
    progress: bool = False,
) -> VerifyReport:
    """A vertical job against its unsplit multi-input model: ``parties`` parties each
    hold one band of every image of ``data`` (:func:`image_parts`) and their own copy of
    ``model``'s front; the first holds the labels. Exact with codec ``none``."""
    names = [f"hospital-{i + 1}" for i in range(parties)]
    mode = config.split_mode
    example = data.images[:2]
    built = build_vertical(
        same_model_parts(model, example, config.cuts, names),
        mode=mode,  # type: ignore[arg-type]
        label_party=names[0],
        seed=config.seed,
    )
    identifiers = tuple(f"record-{i:06d}" for i in range(len(data)))
    bands = image_parts(data.images, parties)
    records = [
        VerticalParty(name, identifiers, band, data.labels if i == 0 else None)
        for i, (name, band) in enumerate(zip(names, bands, strict=True))
    ]
    with deterministic(), torch.random.fork_rng(devices=[]):
        job = VerticalJob(built, config, records, minimum=1)
        per_run = config.rounds * turn_length(config, len(job.alignment))
        with tqdm(total=2 * per_run, desc="verifying", unit="step", disable=not progress) as bar:
            bar.set_postfix(run="split")
            torch.manual_seed(config.seed)
            steps = sum(r.steps for r in job.run(on_step=lambda _: bar.update(1)))
            bar.set_postfix(run="unsplit")
            torch.manual_seed(config.seed)

            def counted() -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
                for batch in job.all_batches():
                    yield batch
                    bar.update(1)

            reference = train_vertical_unsplit(built, counted(), config)
    return compare_states(job.state_dict(), reference.state_dict(), steps)
