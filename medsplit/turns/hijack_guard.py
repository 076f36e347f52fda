"""The hospital's hijacking check on a turn (``privacy.hijack_detection``, SplitOut).

Before its first step the hospital simulates honest training on ``honest_records`` of
its own training data: its front as the turn starts, the rest of the job's model (the
server's segments at their initial weights, its own head as it holds it) trained here
with the job's optimizers and batch size. The gradients that reach the cut in those
steps are the honest points of a :class:`~medsplit.defenses.hijack.SplitOutDetector`.
Every gradient frame of the server that carries the gradient at the front's cut is then
judged before anything of it is applied; a tripped detector raises
:class:`~medsplit.defenses.hijack.HijackDetected` and the turn ends there.

:class:`SplitGuardCheck` is the other method (``splitguard``, vanilla mode): it simulates
nothing; it picks the steps whose labels are faked and scores the server's gradients for
them against the regular ones (:mod:`medsplit.defenses.splitguard`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch

from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.defenses.hijack import SplitOutDetector, Verdict, gradient_features
from medsplit.defenses.options import HijackDetection
from medsplit.defenses.splitguard import SplitGuardDetector, fake_labels, is_probe, summed
from medsplit.errors import ConfigError
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn
from medsplit.training.config import TrainingConfig
from medsplit.wire import Frame, FrameKind

__all__ = ["HijackGuard", "SplitGuardCheck", "honest_gradients"]


def honest_gradients(
    *,
    split: SplitModel,
    config: TrainingConfig,
    parties: Mapping[str, Party],
    train: DataSplit,
    options: HijackDetection,
    loss_fn: LossFn,
) -> np.ndarray:
    """The summaries of the cut's gradients over an honest simulation (one row a step).

    Nothing of ``parties`` changes: the simulation trains copies.

    Raises:
        ConfigError: the mode's hospital holds no front at the first segment (a vertical
            party's turn), or too few records for one batch.
    """
    own = config.split_mode.client_segments()
    if own.get("front") != 0:
        raise ConfigError(
            f"hijack_detection splitout simulates a model whose first segment is the "
            f"hospital's front; mode {config.mode!r} is not cut that way"
        )
    names = {index: name for name, index in own.items()}
    segments: list[Party] = []
    for index, segment in enumerate(split.segments):
        if index in names:
            held = parties[names[index]]
            segments.append(Party.create(copy.deepcopy(held.module), config.client_optimizer))
        else:
            segments.append(Party.create(copy.deepcopy(segment), config.server_optimizer))
    records = min(options.honest_records, len(train))
    batch = config.batch_size
    if records < batch:
        raise ConfigError(
            f"hijack_detection needs at least one batch ({batch}) of honest records; "
            f"this hospital has {records}"
        )
    images, labels = train.images[:records], train.labels[:records]
    generator = torch.Generator().manual_seed(config.seed)
    rows = []
    for _ in range(options.simulated_epochs):
        order = torch.randperm(records, generator=generator)
        for start in range(0, records - batch + 1, batch):  # full batches, as drop_last
            pick = order[start : start + batch]
            x, y = images[pick], labels[pick]
            front = segments[0].module(x)
            cut = {n: t.detach().requires_grad_(t.is_floating_point()) for n, t in front.items()}
            out: object = cut
            for party in segments[1:]:
                out = party.module(**out)  # type: ignore[arg-type]
            loss = loss_fn(out, y)  # type: ignore[arg-type]
            loss.backward()
            grads = {n: t.grad for n, t in cut.items() if t.grad is not None}
            rows.append(gradient_features(grads, y))
            torch.autograd.backward(
                [front[n] for n in grads], [grads[n] for n in grads]
            )  # the front learns as it would from an honest server
            for party in segments:
                party.step()
    return np.stack(rows)


class HijackGuard:
    """Judges each gradient frame at the front's cut before the hospital applies it.

    Args:
        detector: fitted on honest gradients (:func:`honest_gradients`).
        cut: the names of the tensors crossing the front's cut.
    """

    def __init__(self, detector: SplitOutDetector, cut: tuple[str, ...]) -> None:
        self.detector = detector
        self.cut = cut

    @classmethod
    def simulated(
        cls,
        *,
        split: SplitModel,
        config: TrainingConfig,
        parties: Mapping[str, Party],
        train: DataSplit,
        loss_fn: LossFn,
    ) -> HijackGuard:
        """A guard fitted on this hospital's honest simulation (the job's options)."""
        options = config.privacy.hijack_detection
        if options is None:
            raise ConfigError("the job does not turn hijack_detection on")
        if options.method != "splitout":
            raise ConfigError(
                f"hijack_detection {options.method!r} is not available at this hospital; "
                "use method splitout"
            )
        honest = honest_gradients(
            split=split,
            config=config,
            parties=parties,
            train=train,
            options=options,
            loss_fn=loss_fn,
        )
        detector = SplitOutDetector(
            honest,
            neighbours=options.neighbours,
            window=options.window,
            outliers=options.outliers,
        )
        return cls(detector, tuple(t.name for t in split.boundaries[0]))

    def check(self, frame: Frame, labels: torch.Tensor | None) -> Verdict | None:
        """Judge ``frame`` if it carries the gradient at the front's cut.

        Raises:
            HijackDetected: the detector tripped (now or before); nothing of the frame
                may be applied.
        """
        if self.detector.tripped is not None:
            raise self.detector.tripped
        if frame.meta.kind != FrameKind.GRADIENTS:
            return None
        grads = {n: frame.tensors[n] for n in self.cut if n in frame.tensors}
        if not grads:
            return None
        return self.detector.judge(gradient_features(grads, labels), step=frame.meta.step)


class SplitGuardCheck:
    """SplitGuard on a vanilla turn: picks the fake batches and judges their gradients.

    Args:
        detector: keeps the gradients and the score (:mod:`medsplit.defenses.splitguard`).
        cut: the names of the tensors crossing the front's cut.
        options: the job's ``hijack_detection`` (its SplitGuard settings).
        seed: the job's seed (the probes are drawn from it, the round and the step).
        classes: the classes the fake labels are drawn from.
    """

    def __init__(
        self,
        detector: SplitGuardDetector,
        cut: tuple[str, ...],
        *,
        options: HijackDetection,
        seed: int,
        classes: int,
    ) -> None:
        self.detector, self.cut, self.options = detector, cut, options
        self.seed, self.classes = seed, classes

    @classmethod
    def of(cls, *, split: SplitModel, config: TrainingConfig, classes: int) -> SplitGuardCheck:
        """The check the job's options ask for."""
        options = config.privacy.hijack_detection
        if options is None or options.method != "splitguard":
            raise ConfigError("the job does not turn hijack_detection splitguard on")
        if not config.split_mode.label_probes:
            raise ConfigError(
                f"hijack_detection splitguard needs the labels to travel (vanilla mode); "
                f"mode {config.mode!r} keeps them at the hospital"
            )
        detector = SplitGuardDetector(
            threshold=options.threshold, min_probes=options.min_probes, power=options.power
        )
        cut = tuple(t.name for t in split.boundaries[0])
        return cls(detector, cut, options=options, seed=config.seed, classes=max(2, classes))

    def labels(self, labels: torch.Tensor, *, round_: int, step: int) -> torch.Tensor | None:
        """Fake labels when step ``step`` is a probe, else ``None``."""
        if labels.dim() != 1 or not is_probe(
            seed=self.seed,
            round_=round_,
            step=step,
            probability=self.options.probe_probability,
            start=self.options.start_step,
        ):
            return None  # masks (segmentation) are never faked
        return fake_labels(labels, classes=self.classes, seed=self.seed, round_=round_, step=step)

    def check(self, frame: Frame, *, fake: bool, labels: torch.Tensor) -> float | None:
        """Keep the frame's gradient at the front's cut; the score after a fake batch.

        ``labels`` are the batch's true classes, also for a fake batch.

        Raises:
            SplitGuardDetected: the score fell below the threshold (now or before).
        """
        if self.detector.tripped is not None:
            raise self.detector.tripped
        if frame.meta.kind != FrameKind.GRADIENTS:
            return None
        grads = {n: frame.tensors[n] for n in self.cut if n in frame.tensors}
        if not grads:
            return None
        vector = summed(grads, labels, classes=self.classes)
        return self.detector.judge(vector, fake=fake, step=frame.meta.step)
