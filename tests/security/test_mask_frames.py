"""Invariant 5 for segmentation: masks and per-pixel logits are checked before use.

A hostile hospital (a real ``TurnClient`` whose activations frame is tampered with on
the way out) against the real server side of a turn (``TurnServer`` with the job's
limits: masks of the job's shape and classes) over a real Redis, in a vanilla UNet
segmentation job, where the masks travel with the activations. Each bad mask fails the
turn naming the hospital and the check; the server's segment stays as the last honest
step left it (``torch.equal``), and the hospital is told at once (``stopped``).

A hostile server (a real ``TurnServer`` whose validation frame is tampered with) against
the real ``TurnClient``: logits of another spatial size than the job's masks are refused
before the hospital scores anything.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis
import torch

from medsplit.channel import StreamPair
from medsplit.channel.redis import RedisChannel
from medsplit.data import synthetic_segmentation_split
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.roles import LABELS, LOGITS
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel, cached_split, client_parties, server_party
from medsplit.turns import (
    ClientOutcome,
    Directive,
    MemoryCheckpointStore,
    MemorySnapshots,
    TurnClient,
    TurnIds,
    TurnProgress,
    TurnServer,
)
from medsplit.turns.server import SERVER_PARTY, FrameRefused
from medsplit.wire import Frame, FrameKind
from tests.redis_server import session_keys

SHAPE = (1, 32, 32)
BATCH, STEPS, HOSTILE_STEP = 4, 3, 1
Change = Callable[[torch.Tensor], torch.Tensor]


class HostileServer(TurnServer):
    """An honest server, except that ``change`` rewrites the first validation logits."""

    def __init__(self, *, change: Change, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.change = change

    def _send(self, frame: Frame) -> None:
        if frame.meta.kind == FrameKind.EVAL_OUTPUTS and frame.meta.step == STEPS:
            frame = Frame(frame.meta, {LOGITS: self.change(frame.tensors[LOGITS])})
        super()._send(frame)


class HostileClient(TurnClient):
    """An honest hospital, except that ``change`` rewrites the masks of one step's frame."""

    def __init__(self, *, change: Change, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        honest = self.io.send

        def send(frame: Frame) -> None:
            if frame.meta.kind == FrameKind.ACTIVATIONS and frame.meta.step == HOSTILE_STEP:
                frame = Frame(frame.meta, {**frame.tensors, LABELS: change(frame.tensors[LABELS])})
            honest(frame)

        self.io.send = send  # type: ignore[method-assign]


class Hooks:
    """Keeps the server segment's state after every step it answered."""

    def __init__(self) -> None:
        self.module: torch.nn.Module | None = None
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self.stop = threading.Event()

    def directive(self) -> Directive:
        return Directive.STOP if self.stop.is_set() else Directive.RUN

    def progress(self, progress: TurnProgress) -> None:
        assert self.module is not None
        self.after[progress.steps] = {
            k: v.detach().clone() for k, v in self.module.state_dict().items()
        }

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


@pytest.fixture
def relay(redis_url: str) -> Iterator[tuple[str, StreamPair]]:
    job = f"job-mask{uuid.uuid4().hex[:8]}"
    streams = session_keys().streams(job, "general")
    yield job, streams
    client = redis.Redis.from_url(redis_url)
    client.delete(*(k for s in (streams.up, streams.down) for k in (s, f"{s}:seq")))
    client.close()


def turn(
    redis_url: str,
    relay: tuple[str, StreamPair],
    *,
    client_change: Change | None = None,
    server_change: Change | None = None,
) -> tuple[list[BaseException], Hooks, Any, Callable[[], Any]]:
    """A vanilla UNet segmentation turn over Redis: the refusals the server raised, its
    hooks, its party, and how to run the hospital (returns its report)."""
    job, streams = relay
    config = TrainingConfig(
        cuts=("model.skip.submodule.down",),
        batch_size=BATCH,
        max_steps_per_turn=STEPS,
        job=job,
        task="segmentation",
    )
    split = cached_split(JobModel("unet", 2, 1, 2, SHAPE, seed=5), config.cuts)
    ids = TurnIds(job, 0, 0, config.mode, config.codec)
    train = synthetic_segmentation_split(BATCH * STEPS, shape=SHAPE, seed=1)
    val = synthetic_segmentation_split(BATCH, shape=SHAPE, seed=2)
    limits = turn_limits(
        config, num_classes=2, train=len(train), val=len(val), label_shape=(1, *SHAPE[1:])
    )
    hooks = Hooks()
    party = server_party(split, config)
    hooks.module = party.module
    server_kwargs: dict[str, Any] = dict(
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        party=party,
        store=MemoryCheckpointStore(export_parties({SERVER_PARTY: server_party(split, config)})),
        hooks=hooks,
        limits=limits,
        loss_fn=config.loss_fn(),
        hospital="general",
        poll_interval=0.05,
        silence_timeout=10,
    )
    server = (
        HostileServer(change=server_change, **server_kwargs)
        if server_change
        else TurnServer(**server_kwargs)
    )
    client_kwargs: dict[str, Any] = dict(
        ids=ids,
        channel=RedisChannel(redis_url),
        streams=streams,
        split=split,
        parties=lambda: client_parties(split, config),
        start=export_parties(client_parties(split, config)),
        config=config,
        train=train,
        val=val,
        snapshots=MemorySnapshots(),
        reply_timeout=10,
        limits=limits,
    )
    client = (
        HostileClient(change=client_change, **client_kwargs)
        if client_change
        else TurnClient(**client_kwargs)
    )
    refused: list[BaseException] = []

    def serve() -> None:
        try:
            server.run()
        except FrameRefused as e:
            refused.append(e)

    def run() -> Any:
        serving = threading.Thread(target=serve, daemon=True)
        serving.start()
        try:
            return client.run()
        finally:
            hooks.stop.set()
            serving.join(10)
            client.channel.close()
            server.channel.close()

    return refused, hooks, party, run


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (lambda y: y[:, :, :16, :16].contiguous(), "shape"),
        (lambda y: y[:, 0, 0, 0].contiguous(), "shape"),
        (lambda y: y.to(torch.float32), "shape"),
        (lambda y: torch.where(y == 1, 2, y), "labels in range"),
    ],
    ids=["mask-of-another-size", "class-per-image", "float-mask", "class-2-of-2"],
)
def test_a_bad_mask_fails_the_turn_and_changes_nothing(
    redis_url: str, relay: tuple[str, StreamPair], change: Change, check: str
) -> None:
    refused, hooks, party, run = turn(redis_url, relay, client_change=change)
    report = run()
    (error,) = refused
    assert f"hospital general's activations frame for step {HOSTILE_STEP}" in str(error)
    assert f"failed the {check!r} check" in str(error), error
    assert report.outcome == ClientOutcome.STOPPED  # told at once
    # The server's segment is as the honest step before left it, bit for bit.
    honest = hooks.after[HOSTILE_STEP]
    now = party.module.state_dict()
    assert max(hooks.after) == HOSTILE_STEP
    assert all(torch.equal(now[k], v) for k, v in honest.items())


def test_logits_of_another_size_than_the_masks_are_refused_by_the_hospital(
    redis_url: str, relay: tuple[str, StreamPair]
) -> None:
    _, _, _, run = turn(redis_url, relay, server_change=lambda t: t[:, :, :16, :16].contiguous())
    with pytest.raises(FrameRejected) as refused:
        run()
    assert refused.value.check == "shape", refused.value
    assert f"the server's eval_outputs frame for step {STEPS}" in str(refused.value)
    assert "(B, 2, 32, 32)" in str(refused.value)
