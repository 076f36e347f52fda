"""The coordinator's refusal of a vertical job's inference, by name."""

from __future__ import annotations

from types import SimpleNamespace

from medsplit.training.config import TrainingConfig
from training.inference import inference_refusal


def test_a_vertical_job_is_refused_saying_why_and_the_others_are_not() -> None:
    vertical = SimpleNamespace(
        training_config=lambda: TrainingConfig(cuts=("2", "4"), mode="vertical")
    )
    refusal = inference_refusal(vertical)  # type: ignore[arg-type]
    assert refusal is not None and "every party's" in refusal and "vertical" in refusal
    for mode, cuts in (("vanilla", ("2",)), ("ushaped", ("2", "4")), ("splitfed", ("2",))):
        job = SimpleNamespace(training_config=lambda m=mode, c=cuts: TrainingConfig(cuts=c, mode=m))
        assert inference_refusal(job) is None  # type: ignore[arg-type]
