"""What a hospital keeps of a job's split model between turns: its own segments with
their initial weights, the server's as structure only (``hospital_split``)."""

from __future__ import annotations

import torch

from medsplit.defenses.options import PrivacyOptions
from medsplit.models import get_model_spec
from medsplit.training.config import TrainingConfig
from medsplit.training.setup import JobModel, cached_split, hospital_segments, hospital_split

MODEL = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), seed=3)


def config(mode: str = "vanilla", **privacy: object) -> TrainingConfig:
    cuts = get_model_spec("small_cnn").default_cuts(2 if mode == "ushaped" else 1)
    return TrainingConfig(cuts=tuple(cuts), mode=mode, privacy=PrivacyOptions.from_json(privacy))


def devices(segment: torch.nn.Module) -> set[str]:
    return {t.device.type for t in (*segment.parameters(), *segment.buffers())}


def test_a_hospital_holds_its_segments_weights_and_the_servers_shape_only() -> None:
    for cfg, held in ((config(), (0,)), (config("ushaped"), (0, 2))):
        split = hospital_split(MODEL, cfg.cuts, hospital_segments(cfg))
        whole = cached_split(MODEL, cfg.cuts)
        assert split.boundaries == whole.boundaries
        for index, (segment, reference) in enumerate(
            zip(split.segments, whole.segments, strict=True)
        ):
            names = [n for n, _ in segment.named_parameters()]
            assert names == [n for n, _ in reference.named_parameters()]
            if index in held:  # the initial weights, as every party builds them
                assert devices(segment) == {"cpu"}
                state, want = segment.state_dict(), reference.state_dict()
                assert all(torch.equal(state[k], want[k]) for k in want)
            else:
                assert devices(segment) == {"meta"}
                shapes = {k: t.shape for k, t in reference.state_dict().items()}
                assert {k: t.shape for k, t in segment.state_dict().items()} == shapes


def test_a_hospital_that_simulates_honest_training_holds_every_segment() -> None:
    cfg = config(hijack_detection={"method": "splitout"})
    assert hospital_segments(cfg) == {0, 1}
    split = hospital_split(MODEL, cfg.cuts, hospital_segments(cfg))
    assert [devices(s) for s in split.segments] == [{"cpu"}, {"cpu"}]
    assert hospital_segments(config(hijack_detection={"method": "splitguard"})) == {0}
