"""A hospital's check of the gradients it receives for a hijacking server (SplitOut).

A malicious server can send, in place of the task's gradient at the cut, the gradient of
a loss of its own choosing and so steer the hospital's layers into a feature space it can
invert (feature-space hijacking, Pasquini, Ateniese and Bernaschi, CCS 2021). The
hospital cannot verify the server's computation, but it can tell what honest gradients
look like: it trains a local copy of the whole model on a small share of its own data,
records the gradients at the cut, and fits a novelty detector on them (SplitOut, Erdogan
et al., CANS 2024: scikit-learn's :class:`~sklearn.neighbors.LocalOutlierFactor` with as
many neighbours as the honest points allow, and a window of the last decisions).

Each gradient frame is summarised by :func:`gradient_features`, a few numbers that do
not depend on the order of the batch's samples nor on its size: SplitOut's flattened
gradients would compare the samples of two batches position by position, which says
nothing when batches are drawn at random. The summary keeps what the task's loss shapes
and a hijacker's cannot: how strongly each sample's gradient depends on its label.

Core only: no Django, no Celery; the simulation that produces the honest gradients is
:mod:`medsplit.turns.hijack_guard`'s (it needs the job's model and optimizers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from medsplit.errors import ConfigError, MedSplitError

__all__ = [
    "FEATURES",
    "REASON_PREFIX",
    "HijackDetected",
    "SplitOutDetector",
    "Verdict",
    "gradient_features",
]

#: The summary of a gradient frame, in the order :func:`gradient_features` returns it.
FEATURES = ("log_norm", "norm_spread", "coherence", "label_share")
_TINY = 1e-12
#: How the reason a hospital gives the coordinator begins when its detector tripped.
REASON_PREFIX = "hijacking suspected"


class HijackDetected(MedSplitError):
    """The server's gradients are not those of honest training: the hospital stops.

    Attributes:
        step: the step whose gradient frame tripped the detector (it was not applied).
        outliers: how many of the last ``window`` frames were outliers.
        window: how many frames the decision looked at.
        score: the tripping frame's outlier score (LOF's, higher is stranger).
    """

    def __init__(self, *, step: int, outliers: int, window: int, score: float) -> None:
        self.step, self.outliers, self.window, self.score = step, outliers, window, score
        super().__init__(
            f"{REASON_PREFIX}: {outliers} of the server's last {window} gradient frames "
            f"(through step {step}) are unlike honest training's (outlier score "
            f"{score:.2f}); this hospital refuses every further step of the job"
        )


@dataclass(frozen=True)
class Verdict:
    """The detector's decision on one gradient frame."""

    step: int
    score: float
    outlier: bool


def gradient_features(
    gradients: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    labels: torch.Tensor | None = None,
) -> np.ndarray:
    """The summary of one batch's gradients at the cut (:data:`FEATURES`).

    Args:
        gradients: the floating tensors of the gradient at the cut, each ``(B, ...)``.
        labels: the batch's class indices ``(B,)``; ``None`` (or masks) leaves the label
            feature at 0, for the honest gradients and the received ones alike.

    The per-sample gradients are scaled by ``B`` (a mean-reduced loss divides them by
    it), so a short last batch reads like a full one.
    """
    tensors = list(gradients.values()) if isinstance(gradients, Mapping) else list(gradients)
    if not tensors:
        raise ConfigError("a gradient frame with no gradient at the cut cannot be checked")
    batch = tensors[0].shape[0]
    g = torch.cat([t.detach().reshape(batch, -1).double().cpu() for t in tensors], dim=1) * batch
    norms = g.norm(dim=1)
    mean_norm = float(norms.mean())
    log_norm = float(np.log10(mean_norm + _TINY))
    spread = float(norms.std(unbiased=False)) / (mean_norm + _TINY)
    coherence = float(g.mean(dim=0).norm()) / (mean_norm + _TINY)
    share = 0.0
    if labels is not None and labels.dim() == 1 and labels.shape[0] == batch:
        share = _label_share(g, labels.cpu())
    return np.array([log_norm, spread, coherence, share], dtype=np.float64)


def _label_share(g: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of the gradients' variance that the labels explain (between-class over
    total): near 1 when the loss of the labels drives them, near 0 when nothing of them
    depends on the label."""
    centre = g.mean(dim=0)
    total = float(((g - centre) ** 2).sum())
    if total <= _TINY:
        return 0.0
    between = 0.0
    for c in labels.unique():
        members = g[labels == c]
        between += members.shape[0] * float(((members.mean(dim=0) - centre) ** 2).sum())
    return between / total


class SplitOutDetector:
    """A LOF novelty detector over honest gradients' summaries, with a window rule.

    Args:
        honest: the summaries (:func:`gradient_features`) of honest gradients, one row a
            step.
        neighbours: LOF's neighbours; ``None``: as many as the honest points allow (all
            but one), as SplitOut does.
        window: how many of the latest frames a decision looks at.
        outliers: how many of them must be outliers to stop (``window`` frames are seen
            before any decision unless ``outliers`` come sooner).

    After it has tripped it refuses every frame (:attr:`tripped`).
    """

    def __init__(
        self,
        honest: np.ndarray,
        *,
        neighbours: int | None = None,
        window: int = 5,
        outliers: int = 3,
    ) -> None:
        honest = np.asarray(honest, dtype=np.float64)
        if honest.ndim != 2 or honest.shape[0] < 3:
            raise ConfigError(
                "the hijacking detector needs the gradients of at least 3 honest steps; "
                "give it more honest records (hijack_detection.honest_records)"
            )
        if not 1 <= outliers <= window:
            raise ConfigError(f"outliers must be in [1, window={window}], got {outliers}")
        k = honest.shape[0] - 1 if neighbours is None else neighbours
        if not 1 <= k < honest.shape[0]:
            raise ConfigError(
                f"the detector has {honest.shape[0]} honest steps, so neighbours must be in "
                f"[1, {honest.shape[0] - 1}], got {neighbours}"
            )
        # Imported here: only a job with hijack detection on fits a detector, and
        # scikit-learn's neighbours module is resident memory every agent would carry.
        from sklearn.neighbors import LocalOutlierFactor
        from sklearn.preprocessing import StandardScaler

        self.scaler = StandardScaler().fit(honest)
        self.lof = LocalOutlierFactor(n_neighbors=k, novelty=True)
        self.lof.fit(self.scaler.transform(honest))
        self.window = window
        self.outliers = outliers
        self.recent: deque[bool] = deque(maxlen=window)
        self.verdicts: list[Verdict] = []
        self.tripped: HijackDetected | None = None

    def judge(self, features: np.ndarray, *, step: int) -> Verdict:
        """Score one frame's summary and keep the decision; raises when the window trips.

        Raises:
            HijackDetected: ``outliers`` of the last ``window`` frames were outliers (this
                frame among them), or the detector had tripped before.
        """
        if self.tripped is not None:
            raise self.tripped
        x = self.scaler.transform(np.asarray(features, dtype=np.float64).reshape(1, -1))
        score = float(-self.lof.score_samples(x)[0])
        verdict = Verdict(step=step, score=score, outlier=bool(self.lof.predict(x)[0] == -1))
        self.verdicts.append(verdict)
        self.recent.append(verdict.outlier)
        count = sum(self.recent)
        if count >= self.outliers:
            self.tripped = HijackDetected(
                step=step, outliers=count, window=len(self.recent), score=score
            )
            raise self.tripped
        return verdict
