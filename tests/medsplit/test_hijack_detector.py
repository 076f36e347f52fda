"""The hijacking detector's parts: the gradient summary, the LOF window, the options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medsplit.defenses import HijackDetection, PrivacyOptions, PrivacyOptionsError
from medsplit.defenses.hijack import HijackDetected, SplitOutDetector, gradient_features

HONEST = np.random.default_rng(0).normal(size=(40, 4))
FAR = np.full(4, 50.0)
NEAR = np.zeros(4)


def test_the_label_share_is_one_when_the_labels_alone_drive_the_gradients() -> None:
    direction = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1])
    by_label = torch.where(labels[:, None, None] == 1, direction, -direction)
    alike = direction.expand(8, 8, 3)
    assert gradient_features([by_label], labels)[3] == pytest.approx(1.0, abs=1e-12)
    assert gradient_features([alike], labels)[3] == 0.0  # no variance for labels to explain


def test_a_short_batch_reads_like_a_full_one() -> None:
    g = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    # The same per-sample gradients under a mean over 4 and over 8 samples.
    assert np.allclose(gradient_features([g / 4]), gradient_features([g.repeat(2, 1) / 8]))


def test_outliers_in_the_window_trip_the_detector_and_it_stays_tripped() -> None:
    detector = SplitOutDetector(HONEST, window=3, outliers=2)
    assert not detector.judge(NEAR, step=0).outlier
    assert detector.judge(FAR, step=1).outlier
    with pytest.raises(HijackDetected) as caught:
        detector.judge(FAR, step=2)
    assert (caught.value.step, caught.value.outliers) == (2, 2)
    with pytest.raises(HijackDetected):
        detector.judge(NEAR, step=3)  # a hijacked job takes no further step


def test_an_outlier_that_leaves_the_window_is_forgiven() -> None:
    detector = SplitOutDetector(HONEST, window=2, outliers=2)
    detector.judge(FAR, step=0)
    detector.judge(NEAR, step=1)
    detector.judge(NEAR, step=2)
    assert detector.judge(FAR, step=3).outlier
    assert detector.tripped is None


def test_the_detector_options_are_checked() -> None:
    with pytest.raises(PrivacyOptionsError, match="outliers must be an integer in"):
        PrivacyOptions.from_json({"hijack_detection": {"window": 3, "outliers": 4}})
    options = PrivacyOptions.from_json({"hijack_detection": {"neighbours": 10, "window": 7}})
    assert options.hijack_detection == HijackDetection(neighbours=10, window=7)
