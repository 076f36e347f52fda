"""SplitGuard's fake-label probes (Erdogan, Küpçü and Çiçek, WPES 2022), vanilla mode.

Now and then (``probability``, drawn from the job's seed, round and step so that two
runs probe the same steps) the hospital sends a *fake batch*: its activations as usual,
its labels replaced by random classes. An honest server's gradient for a fake batch
points elsewhere than those of regular batches, since the task's loss depends on the
labels; a hijacker's loss ignores the labels, so its fake and regular gradients look
alike. With F the fake batches' gradients and R the regular ones (R1, R2 its two halves
in order), the score is, after the paper::

    a  = θ(F, R) − θ(R1, R2)
    SG = max(0, 2 / (1 + e^(−2a)) − 1) ** power

θ the angle between two sets' mean gradients. The paper weights each angle by the
difference of the two sets' norms, d(F, R)·θ(F, R) − d(R1, R2)·θ(R1, R2); we leave the
norms out: they drift as training (or an attack) moves, and on the harness they scored
a hijacker above honest servers, while the angles alone separated them. SG is near 1
for an honest server, near 0 for a hijacker: after ``min_probes`` fake batches a score
**below** ``threshold`` stops the hospital (the score does not depend on the gradients'
scale).

Each batch's gradient is the cut's gradient summed over the samples of each true class
(:func:`summed`; our change: the paper flattens the batch, which compares samples of two
batches position by position), so the order of a batch's samples does not matter and a
binary task's two classes do not cancel.

The hospital does not apply a fake batch's gradient to its own front (it would learn
random labels); the server does train on it, so a job with SplitGuard on is not exact
against unsplit training. Core only: no Django, no Celery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from medsplit.defenses.hijack import REASON_PREFIX, HijackDetected
from medsplit.errors import ConfigError, MedSplitError

__all__ = ["SplitGuardDetected", "SplitGuardDetector", "is_probe", "splitguard_score"]

_TINY = 1e-12


class SplitGuardDetected(HijackDetected):
    """SplitGuard's score fell below its threshold: the hospital stops.

    Attributes:
        step: the step whose gradient frame tripped the detector (it was not applied).
        score: SplitGuard's score then (near 1: honest, near 0: hijacked).
        probes: the fake batches the score was taken over.
    """

    def __init__(self, *, step: int, score: float, probes: int, threshold: float) -> None:
        self.step, self.score, self.probes = step, score, probes
        self.outliers, self.window = probes, probes  # HijackDetected's fields, for reports
        MedSplitError.__init__(
            self,
            f"{REASON_PREFIX}: SplitGuard's score over {probes} fake-label batches is "
            f"{score:.3f} (below {threshold:g}) at step {step}: the server's gradients do "
            "not depend on the labels; this hospital refuses every further step of the job",
        )


def _angle(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na <= _TINY or nb <= _TINY:
        return 0.0
    return float(np.arccos(np.clip(float(a @ b) / (na * nb), -1.0, 1.0)))


def splitguard_score(fake: np.ndarray, regular: np.ndarray, *, power: float = 1.0) -> float:
    """SplitGuard's score of fake-batch gradients against regular ones (rows: batches).

    Raises:
        ConfigError: no fake gradient, or fewer than 2 regular ones.
    """
    fake, regular = np.atleast_2d(fake), np.atleast_2d(regular)
    if fake.shape[0] < 1 or regular.shape[0] < 2:
        raise ConfigError("SplitGuard's score needs a fake batch and at least 2 regular ones")
    half = regular.shape[0] // 2
    f, r = fake.mean(axis=0), regular.mean(axis=0)
    r1, r2 = regular[:half].mean(axis=0), regular[half:].mean(axis=0)
    a = _angle(f, r) - _angle(r1, r2)
    return max(0.0, 2.0 / (1.0 + math.exp(-2.0 * a)) - 1.0) ** power


def is_probe(*, seed: int, round_: int, step: int, probability: float, start: int) -> bool:
    """Whether step ``step`` of round ``round_`` sends a fake batch (the same every run)."""
    if step < start or probability <= 0:
        return False
    generator = torch.Generator().manual_seed(_mix(seed, round_, step))
    return float(torch.rand((), generator=generator)) < probability


def fake_labels(
    labels: torch.Tensor, *, classes: int, seed: int, round_: int, step: int
) -> torch.Tensor:
    """Random classes in place of ``labels`` (drawn from the job's seed, round and step)."""
    generator = torch.Generator().manual_seed(_mix(seed, round_, step) ^ 0x5F3759DF)
    return torch.randint(0, classes, labels.shape, generator=generator, dtype=labels.dtype)


def _mix(seed: int, round_: int, step: int) -> int:
    return (seed * 1_000_003 + round_ * 7919 + step) % (2**63)


def summed(
    gradients: Mapping[str, torch.Tensor], labels: torch.Tensor, *, classes: int
) -> np.ndarray:
    """The cut's gradient summed over each true class's samples, the blocks as one vector.

    ``labels`` are the batch's true classes (not the fake ones sent): an honest server's
    gradient follows the labels it was sent, so a fake batch's blocks mix and cancel; a
    hijacker's follows no label, so fake and regular blocks alike.
    """
    batch = labels.shape[0]
    g = torch.cat([t.detach().double().cpu().reshape(batch, -1) for t in gradients.values()], 1)
    onehot = torch.nn.functional.one_hot(labels.cpu().long(), classes).double()
    return (onehot.T @ g).reshape(-1).numpy()


class SplitGuardDetector:
    """Keeps the fake and regular gradients and stops when the score falls too low.

    After it has tripped it refuses every frame (:attr:`tripped`).
    """

    def __init__(self, *, threshold: float, min_probes: int, power: float = 1.0) -> None:
        self.threshold, self.min_probes, self.power = threshold, min_probes, power
        self.fake: list[np.ndarray] = []
        self.regular: list[np.ndarray] = []
        self.scores: list[tuple[int, float]] = []
        self.tripped: SplitGuardDetected | None = None

    def judge(self, gradient: np.ndarray, *, fake: bool, step: int) -> float | None:
        """Keep one batch's gradient; after a fake one, the score (``None`` before).

        Raises:
            SplitGuardDetected: the score is below the threshold after ``min_probes``
                fake batches, or the detector had tripped before.
        """
        if self.tripped is not None:
            raise self.tripped
        (self.fake if fake else self.regular).append(np.asarray(gradient, dtype=np.float64))
        if not fake or len(self.regular) < 2:
            return None
        score = splitguard_score(np.stack(self.fake), np.stack(self.regular), power=self.power)
        self.scores.append((step, score))
        if len(self.fake) >= self.min_probes and score < self.threshold:
            self.tripped = SplitGuardDetected(
                step=step, score=score, probes=len(self.fake), threshold=self.threshold
            )
            raise self.tripped
        return score
