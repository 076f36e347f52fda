"""A noised job (activation noise: Poisson batches of varying size) against an attacker,
over a real Redis with the real TurnServer and TurnClient.

- A hostile server answers the hospital's noised activations with gradients for another
  batch size (the job's nominal one): the hospital refuses the frame, applies nothing.
- A hostile hospital sends a batch above the Poisson bound the job's limits allow: the
  server refuses it with a reason naming the bound, and tells the hospital.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
import torch

from medsplit.channel import StreamPair
from medsplit.channel.redis import RedisChannel
from medsplit.data import synthetic_split
from medsplit.defenses import PrivacyOptions
from medsplit.defenses.accounting import poisson_bound
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.roles import StepIds
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import Batch, turn_limits
from medsplit.training.setup import JobModel, cached_split, client_parties, server_party
from medsplit.turns import (
    ClientOutcome,
    MemoryCheckpointStore,
    MemorySnapshots,
    TurnClient,
    TurnFailed,
    TurnIds,
    TurnServer,
)
from medsplit.turns.server import SERVER_PARTY
from medsplit.wire import Frame, FrameKind
from tests.redis_server import session_keys
from tests.security.test_hostile_frames import HostileServer, StopWhenSet, with_tensors

STEPS = 3
RECORDS = 48
NOISE = PrivacyOptions.from_json({"activation_noise": {"noise_multiplier": 1.0}})


@pytest.fixture
def relay(redis_url: str) -> Iterator[tuple[str, StreamPair]]:
    job = f"job-dp{uuid.uuid4().hex[:8]}"
    streams = session_keys().streams(job, "general")
    yield job, streams
    client = redis.Redis.from_url(redis_url)
    client.delete(*(k for s in (streams.up, streams.down) for k in (s, f"{s}:seq")))
    client.close()


def _turn(redis_url: str, relay: tuple[str, StreamPair], *, server_cls, batches=None, **extra):
    job, streams = relay
    config = TrainingConfig(
        cuts=("pool1",), batch_size=16, max_steps_per_turn=STEPS, job=job, privacy=NOISE
    )
    model = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), seed=5)
    split = cached_split(model, config.cuts)
    ids = TurnIds(job, 0, 0, config.mode, config.codec)
    train = synthetic_split(RECORDS, shape=(1, 28, 28), num_classes=2, seed=1)
    limits = turn_limits(config, num_classes=2, train=len(train), val=0)
    hooks = StopWhenSet()
    server = server_cls(
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        party=server_party(split, config),
        store=MemoryCheckpointStore(export_parties({SERVER_PARTY: server_party(split, config)})),
        hooks=hooks,
        limits=limits,
        checkpoint_every=1,
        poll_interval=0.05,
        silence_timeout=10,
        **extra,
    )
    client = TurnClient(
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        parties=lambda: client_parties(split, config),
        start=export_parties(client_parties(split, config)),
        config=config,
        train=train,
        val=None,
        snapshots=MemorySnapshots(),
        reply_timeout=10,
        limits=limits,
        batches=batches,
    )
    return server, client, hooks, limits


def test_gradients_for_another_batch_size_from_a_hostile_server_are_refused(
    redis_url: str, relay: tuple[str, StreamPair]
) -> None:
    def nominal(frame: Frame) -> Frame:
        # Gradients for the job's batch_size rows, not the Poisson batch the hospital sent.
        if frame.meta.kind != FrameKind.GRADIENTS:
            return frame
        return with_tensors(
            frame, lambda n, t: t if t.dim() == 0 else t[:1].expand(16, *t.shape[1:]).clone()
        )

    server, client, hooks, _ = _turn(redis_url, relay, server_cls=HostileServer, tamper=nominal)
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    try:
        with pytest.raises(FrameRejected, match="batch") as refused:
            client.run()
    finally:
        hooks.stop.set()
        serving.join(10)
        client.channel.close()
        server.channel.close()
    assert "server" in str(refused.value)
    # Nothing of the refused step applied: the front is as the snapshot before step 0.
    assert client.snapshots.steps() == [0]
    now, before = _weights(client.state()), _weights(client.snapshots.load(0))
    assert all(torch.equal(a, b) for a, b in zip(now, before, strict=True))


def _weights(blob: bytes) -> list[torch.Tensor]:
    from safetensors.torch import load

    return [v for _, v in sorted(load(blob).items())]


def test_a_batch_above_the_poisson_bound_is_refused_by_the_server(
    redis_url: str, relay: tuple[str, StreamPair]
) -> None:
    bound = poisson_bound(16, RECORDS)
    data = synthetic_split(bound + 1, shape=(1, 28, 28), num_classes=2, seed=9)

    def too_many(round_: int) -> Iterator[Batch]:
        for step in range(STEPS):
            ids = StepIds(relay[0], round_, 0, step)
            yield Batch(ids, 0, data.images, data.labels)

    server, client, hooks, limits = _turn(redis_url, relay, server_cls=TurnServer, batches=too_many)
    assert limits.max_batch == bound and not limits.exact_batch
    outcome: dict[str, object] = {}

    def serve() -> None:
        try:
            server.run()
        except TurnFailed as e:
            outcome["error"] = e

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    try:
        report = client.run()
    finally:
        hooks.stop.set()
        serving.join(10)
        client.channel.close()
        server.channel.close()
    error = str(outcome.get("error"))
    assert f"a batch of {bound + 1} samples" in error and f"at most {bound}" in error, error
    assert "Poisson" in error
    assert report.outcome == ClientOutcome.STOPPED
