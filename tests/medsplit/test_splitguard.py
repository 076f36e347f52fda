"""SplitGuard's score and probes (medsplit.defenses.splitguard), on made-up gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medsplit.defenses.splitguard import (
    SplitGuardDetected,
    SplitGuardDetector,
    fake_labels,
    is_probe,
    splitguard_score,
)
from medsplit.errors import ConfigError

RNG = np.random.default_rng(0)
TASK = RNG.normal(size=64)  # the direction the task's loss pushes regular batches


def _batches(n: int, direction: np.ndarray, noise: float = 0.1) -> np.ndarray:
    return direction + noise * RNG.normal(size=(n, direction.size))


def test_fake_gradients_unlike_regular_ones_score_near_one() -> None:
    # An honest server: random labels push elsewhere, and harder (a larger loss).
    fake = _batches(4, -3 * TASK)
    assert splitguard_score(fake, _batches(20, TASK)) > 0.9


def test_fake_gradients_like_regular_ones_score_near_zero() -> None:
    # A hijacker's loss ignores the labels: fake and regular gradients alike.
    assert splitguard_score(_batches(4, TASK), _batches(20, TASK)) < 0.05


def test_the_score_does_not_depend_on_the_gradients_scale() -> None:
    fake, regular = _batches(4, -2 * TASK), _batches(20, TASK)
    assert splitguard_score(fake, regular) == pytest.approx(
        splitguard_score(1e-4 * fake, 1e-4 * regular)
    )


def test_the_score_needs_a_fake_batch_and_two_regular_ones() -> None:
    with pytest.raises(ConfigError, match="at least 2 regular"):
        splitguard_score(_batches(1, TASK), _batches(1, TASK))


def test_the_detector_decides_only_after_min_probes_and_then_refuses_everything() -> None:
    detector = SplitGuardDetector(threshold=0.5, min_probes=3)
    for step, row in enumerate(_batches(6, TASK)):
        assert detector.judge(row, fake=False, step=step) is None
    for step in (6, 7):  # fake batches that look regular, but too few to decide
        score = detector.judge(_batches(1, TASK)[0], fake=True, step=step)
        assert score is not None and score < 0.5
    with pytest.raises(SplitGuardDetected, match="hijacking suspected") as caught:
        detector.judge(_batches(1, TASK)[0], fake=True, step=8)
    assert caught.value.step == 8 and caught.value.probes == 3
    with pytest.raises(SplitGuardDetected):
        detector.judge(_batches(1, TASK)[0], fake=False, step=9)


def test_an_honest_servers_probes_never_trip_the_detector() -> None:
    detector = SplitGuardDetector(threshold=0.5, min_probes=2)
    for step in range(40):
        fake = step % 5 == 4
        row = _batches(1, -3 * TASK if fake else TASK)[0]
        detector.judge(row, fake=fake, step=step)
    assert detector.tripped is None and len(detector.scores) == 8


def test_probes_and_fake_labels_are_the_same_every_run_and_differ_by_step() -> None:
    picks = [is_probe(seed=3, round_=1, step=s, probability=0.2, start=2) for s in range(400)]
    again = [is_probe(seed=3, round_=1, step=s, probability=0.2, start=2) for s in range(400)]
    assert picks == again and not any(picks[:2])
    assert 40 < sum(picks) < 120  # about 20 %
    assert picks != [
        is_probe(seed=4, round_=1, step=s, probability=0.2, start=2) for s in range(400)
    ]
    labels = torch.zeros(64, dtype=torch.long)
    first = fake_labels(labels, classes=2, seed=3, round_=1, step=5)
    assert torch.equal(first, fake_labels(labels, classes=2, seed=3, round_=1, step=5))
    assert not torch.equal(first, fake_labels(labels, classes=2, seed=3, round_=1, step=6))
    assert first.dtype == labels.dtype and set(first.tolist()) == {0, 1}
