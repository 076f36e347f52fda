"""Split inference (medsplit/turns/inference.py): predictions through the split equal the
whole model's forward bit for bit, nothing trains, and a hostile frame is refused."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from medsplit.channel import InMemoryChannel
from medsplit.cutting import split_model
from medsplit.data import synthetic_split
from medsplit.defenses.options import ActivationNoise, PrivacyOptions
from medsplit.protocol import checks
from medsplit.training.config import TrainingConfig
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import TurnIds
from medsplit.turns.inference import (
    InferenceFailed,
    InferenceServed,
    inference_limits,
    inference_round,
    predict_through,
    serve_inference,
)
from medsplit.wire import FrameKind
from tests.redis_server import session_keys


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2)
    )


def config_for(mode: str) -> TrainingConfig:
    cuts = ("2",) if mode == "vanilla" else ("2", "4")
    return TrainingConfig(cuts=cuts, mode=mode, batch_size=8, rounds=2, job="job-infer")


def weights(*modules: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for m in modules for t in m.state_dict().values()]


def serve_in_thread(**kwargs: object) -> tuple[threading.Thread, list[InferenceServed]]:
    served: list[InferenceServed] = []
    worker = threading.Thread(
        target=lambda: served.append(serve_inference(**kwargs)),  # type: ignore[arg-type]
        daemon=True,
    )
    worker.start()
    return worker, served


@dataclass
class Case:
    """A model cut for ``config``, its parties and the images of one request."""

    model: nn.Module
    config: TrainingConfig
    images: torch.Tensor

    def __post_init__(self) -> None:
        self.split = split_model(self.model, self.images[:2], self.config.cuts)
        self.server = server_party(self.split, self.config)
        self.clients = client_parties(self.split, self.config)


def case(config: TrainingConfig, samples: int) -> Case:
    return Case(mlp(), config, synthetic_split(samples, shape=(1, 8, 8), seed=5).images)


def exchange(
    c: Case,
    *,
    request: int = 1,
    asked_batch: int = 8,
    privacy: PrivacyOptions | None = None,
    noise_multiplier: float | None = None,
) -> tuple[torch.Tensor | InferenceFailed, InferenceServed]:
    """One request over an in-process relay, the server serving batches of 8 and the
    hospital sending batches of ``asked_batch``: the logits (or how the request failed)
    and what the server did."""
    config, samples = c.config, len(c.images)
    ids = TurnIds(config.job, inference_round(request), 0, config.split_mode.name)
    channel, streams = InMemoryChannel(), session_keys().streams(config.job, "h0", "infer")
    worker, served = serve_in_thread(
        channel=channel,
        streams=streams,
        ids=ids,
        mode=config.split_mode,
        split=c.split,
        party=c.server,
        limits=inference_limits(serving_batch=8, samples=samples, num_classes=2),
        silence_timeout=20,
        poll=0.05,
    )
    try:
        got: torch.Tensor | InferenceFailed = predict_through(
            channel=channel,
            streams=streams,
            ids=ids,
            mode=config.split_mode,
            split=c.split,
            parties=c.clients,
            images=c.images,
            limits=inference_limits(serving_batch=asked_batch, samples=samples, num_classes=2),
            privacy=privacy or config.privacy,
            noise_multiplier=noise_multiplier,
            seed=3,
            reply_timeout=20,
        ).logits
    except InferenceFailed as e:
        got = e
    worker.join(20)
    return got, served[0]


@pytest.mark.parametrize("mode", ["vanilla", "ushaped", "splitfed"])
def test_predictions_through_the_split_equal_the_whole_models_forward(mode: str) -> None:
    config = config_for("vanilla" if mode == "splitfed" else mode)
    if mode == "splitfed":
        config = TrainingConfig(
            cuts=("2",), mode="splitfed", batch_size=8, rounds=1, job="job-infer"
        )
    c = case(config, 21)  # 3 batches, the last of 5
    before = weights(c.server.module, *(p.module for p in c.clients.values()))
    got, served = exchange(c)
    with torch.no_grad():
        # The whole model the segments were cut from, on the same serving batches (a
        # matrix product's rounding depends on the batch it is computed in).
        want = torch.cat([c.model.eval()(chunk) for chunk in c.images.split(8)])
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    assert served.batches == 3 and served.samples == 21 and not served.refused
    after = weights(c.server.module, *(p.module for p in c.clients.values()))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_activation_noise_applies_as_in_training_and_is_seeded_by_the_request() -> None:
    c = case(config_for("vanilla"), 8)
    privacy = PrivacyOptions(activation_noise=ActivationNoise(clip_norm=1.0, noise_multiplier=1.0))

    def once(request: int) -> torch.Tensor:
        got, _ = exchange(c, request=request, privacy=privacy, noise_multiplier=1.0)
        assert isinstance(got, torch.Tensor)
        return got

    with torch.no_grad():
        clean = c.server.module(**c.clients["front"].module(c.images))
    first, again, other = once(1), once(1), once(2)
    assert torch.equal(first, again)  # seeded: the same request draws the same noise
    assert not torch.equal(first, other)
    assert not torch.equal(first, clean)


def test_a_batch_larger_than_the_serving_batch_is_refused_and_stops_the_request() -> None:
    c = case(config_for("vanilla"), 16)
    before = weights(c.server.module)
    # The hospital claims 16 images in batches of 16: more than the serving batch of 8.
    got, served = exchange(c, asked_batch=16)
    assert isinstance(got, InferenceFailed) and "stopped" in str(got)
    assert checks.BATCH in served.refused and served.batches == 0
    assert all(torch.equal(a, b) for a, b in zip(before, weights(c.server.module), strict=True))


def test_a_frame_out_of_order_or_of_another_kind_is_refused() -> None:
    model, config = mlp(), config_for("vanilla")
    images = synthetic_split(8, shape=(1, 8, 8), seed=5).images
    split = split_model(model, images[:2], config.cuts)
    server, clients = server_party(split, config), client_parties(split, config)
    ids = TurnIds(config.job, inference_round(1), 0, "vanilla")
    channel, streams = InMemoryChannel(), session_keys().streams(config.job, "h0", "infer")
    worker, served = serve_in_thread(
        channel=channel,
        streams=streams,
        ids=ids,
        mode=config.split_mode,
        split=split,
        party=server,
        limits=inference_limits(serving_batch=8, samples=8, num_classes=2),
        silence_timeout=20,
        poll=0.05,
    )
    from medsplit.wire import encode_frame

    out = clients["front"].module(images)
    channel.send(
        streams.up,
        encode_frame(ids.frame(FrameKind.ACTIVATIONS, 0, {**out, "labels": torch.zeros(8).long()})),
    )
    worker.join(20)
    assert checks.STEPS in served[0].refused and served[0].batches == 0
