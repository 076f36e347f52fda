"""What a reader bound to a job's limits refuses, against a real Redis; and the limits
themselves against the real sizes of frames and hand-offs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
import torch

from medsplit.channel import RedisChannel, RelayKeys
from medsplit.errors import RelayAbuse
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.relay_limits import relay_limits
from medsplit.training.setup import JobModel, cached_split, client_parties
from medsplit.wire import Frame, FrameKind, FrameMeta, encode_frame

CHUNK = 1024


@pytest.fixture
def stream(redis_url: str) -> Iterator[str]:
    name = RelayKeys(f"t{uuid.uuid4().hex[:8]}").streams("job-1", "h").up
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name, name + ":seq")
    client.close()


def _raw_entry(url: str, stream: str, *, n: int, data: bytes) -> None:
    """A hostile sender's first chunk: it announces ``n`` chunks and carries ``data``."""
    client = redis.Redis.from_url(url)
    client.xadd(stream, {"s": 1, "m": 1, "i": 0, "n": n, "d": data})
    client.close()


def test_a_message_announcing_more_chunks_than_the_bound_is_refused_unread(
    redis_url: str, stream: str
) -> None:
    _raw_entry(redis_url, stream, n=68, data=b"x" * CHUNK)  # "272 chunks of junk follow"
    reader = RedisChannel(redis_url, chunk_bytes=CHUNK, max_message_bytes=4 * CHUNK)
    with pytest.raises(RelayAbuse, match="68 chunk") as refused:
        reader.receive(stream, timeout=1)
    assert refused.value.stream == stream
    reader.close()


def test_a_chunk_larger_than_a_chunk_is_refused(redis_url: str, stream: str) -> None:
    _raw_entry(redis_url, stream, n=1, data=b"x" * (2 * CHUNK))
    reader = RedisChannel(redis_url, chunk_bytes=CHUNK, max_message_bytes=100 * CHUNK)
    with pytest.raises(RelayAbuse, match="largest frame allows"):
        reader.receive(stream, timeout=1)
    reader.close()


def test_a_flooded_stream_is_refused_at_the_next_read(redis_url: str, stream: str) -> None:
    sender = RedisChannel(redis_url, chunk_bytes=CHUNK)
    for _ in range(20):
        sender.send(stream, b"y" * CHUNK)
    reader = RedisChannel(
        redis_url, chunk_bytes=CHUNK, max_message_bytes=CHUNK, max_backlog_bytes=4 * CHUNK
    )
    with pytest.raises(RelayAbuse, match="flooding"):
        reader.receive(stream, timeout=1)
    sender.close()
    reader.close()


def test_honest_traffic_within_the_bounds_goes_through(redis_url: str, stream: str) -> None:
    sender = RedisChannel(redis_url, chunk_bytes=CHUNK)
    reader = RedisChannel(
        redis_url, chunk_bytes=CHUNK, max_message_bytes=4 * CHUNK, max_backlog_bytes=16 * CHUNK
    )
    for size in (1, CHUNK, 4 * CHUNK):
        sender.send(stream, b"z" * size)
        assert reader.receive(stream, timeout=1) == b"z" * size
    sender.close()
    reader.close()


@pytest.mark.parametrize(
    ("model", "cuts", "shape", "optimizer"),
    [
        ("small_cnn", ("pool1",), (1, 28, 28), "sgd"),
        ("small_cnn", ("pool1", "pool"), (1, 28, 28), "adam"),
        ("skip_net", ("block1",), (1, 28, 28), "adamw"),
    ],
)
def test_the_bounds_hold_the_real_frames_and_hand_offs(
    model: str, cuts: tuple[str, ...], shape: tuple[int, ...], optimizer: str
) -> None:
    config = TrainingConfig(
        cuts=cuts,
        mode="vanilla" if len(cuts) == 1 else "ushaped",
        batch_size=16,
        client_optimizer=OptimizerConfig(name=optimizer, momentum=0.9 if optimizer == "sgd" else 0),
    )
    split = cached_split(JobModel(model, 2, 1, 2, shape, 0), cuts)
    limits = relay_limits(split, config)
    parties = client_parties(split, config)
    outputs = parties["front"].module(torch.rand(16, *shape))
    frame = Frame(
        FrameMeta("job-1", 0, 0, 0, FrameKind.ACTIVATIONS, config.mode, "none"),
        {
            **{k: v.detach() for k, v in outputs.items()},
            "labels": torch.zeros(16, dtype=torch.int64),
        },
    )
    assert len(encode_frame(frame)) <= limits.frame_bytes
    # The hand-off after a step holds the optimizer's state too.
    sum(v.float().sum() for v in outputs.values()).backward()
    for party in parties.values():
        for p in party.module.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        party.step()
    assert len(export_parties(parties)) <= limits.blob_bytes


def test_a_masked_submission_and_its_resend_fit_the_aggregation_stream_bound() -> None:
    """SplitFed's agents leave a masked vector of their segments on their ``agg`` stream:
    the guard's bound holds two (a re-send), and no such stream is allowed in other modes."""
    from medsplit.secagg import MaskedSubmission, RoundId, VectorLayout
    from medsplit.training.aggregate_state import aggregation_parts

    model = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), 0)
    config = TrainingConfig(
        cuts=("pool1", "pool"), mode="splitfed", mode_options={"labels": "hospital"}
    )
    split = cached_split(model, config.cuts)
    floats, _ = aggregation_parts(client_parties(split, config))
    length = VectorLayout.of(floats).length
    rid = RoundId("job-1", 0, 0, {"h1": 10, "h2": 20})
    data = MaskedSubmission.for_round(rid, "h1", torch.zeros(length).numpy().astype("uint64"))
    limits = relay_limits(split, config)
    assert 2 * len(data.to_bytes()) <= limits.aggregation_stream_bytes
    vanilla = relay_limits(cached_split(model, ("pool1",)), TrainingConfig(cuts=("pool1",)))
    assert vanilla.aggregation_stream_bytes == 0
