"""Several hospitals' streams served in one task on one shared server segment
(``medsplit.turns.multi``): the steps it applied, done again one by one in the order it
reports, give the same weights bit for bit, over the in-memory and the Redis channel."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from medsplit.channel import Channel, InMemoryChannel, RedisChannel, StreamPair
from medsplit.cutting import split_model
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, StepIds, StepResult
from medsplit.turns import HospitalSilent, TurnIds
from medsplit.turns.frameio import FrameIO
from medsplit.turns.multi import HospitalStream, MultiStreamServer, StepPolicy, StreamSet
from medsplit.wire import Frame

JOB = "job-multi"
SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)
STEPS = 4
BATCH = 6
CUTS = {"vanilla": ("2",), "ushaped": ("2", "4")}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2)
    )


def batches(position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + position)
    return [
        (
            torch.rand(BATCH, 1, 8, 8, generator=generator),
            torch.randint(0, 2, (BATCH,), generator=generator),
        )
        for _ in range(STEPS)
    ]


class Setup:
    """Two hospitals (their own fronts, and heads in U-shaped mode) and one server segment,
    with a copy of all of it, untrained, for the sequential reference."""

    def __init__(self, mode_name: str) -> None:
        self.mode = get_mode(mode_name)
        self.split = split_model(mlp(), torch.zeros(2, 1, 8, 8), CUTS[mode_name])
        segment = copy.deepcopy(self.split.segments[self.mode.server_segment])
        self.server = Party.create(segment, SGD)
        self.hospitals = [self.parties() for _ in range(2)]
        self.fresh = (copy.deepcopy(self.server), copy.deepcopy(self.hospitals))

    def parties(self) -> dict[str, Party]:
        return {
            name: Party.create(copy.deepcopy(self.split.segments[i]), SGD)
            for name, i in self.mode.client_segments().items()
        }

    def role(self, parties: dict[str, Party]) -> ClientRole:
        return self.mode.client_role(parties, self.split)


def drive(role: ClientRole, io: FrameIO, ids: TurnIds, errors: list[BaseException]) -> None:
    """A hospital's training steps over its streams: its role, nothing else."""
    try:
        for step, (x, y) in enumerate(batches(ids.position)):
            io.send(role.start(StepIds(ids.job, ids.round, ids.position, step), x, y))
            while True:
                frame = None
                while frame is None:
                    frame = io.receive(5.0)
                result = role.receive(frame)
                if isinstance(result, StepResult):
                    break
                io.send(result)
    except BaseException as e:
        errors.append(e)


def serve(
    setup: Setup,
    channels: list[Channel],
    policy: StepPolicy,
    prefix: str,
    *,
    seed: int = 7,
    pair_of: Callable[[int], StreamPair] | None = None,
) -> list[tuple[int, int]]:
    """The server's task on ``channels[0]``, each hospital in a thread on its own, on the
    streams ``pair_of(position)`` names (default: under ``prefix``)."""
    hospitals = []
    for position in range(2):
        ids = TurnIds(JOB, 0, position, setup.mode.name)
        pair = (
            pair_of(position)
            if pair_of is not None
            else StreamPair(up=f"{prefix}:{position}:up", down=f"{prefix}:{position}:down")
        )
        hospitals.append(HospitalStream(ids, pair, STEPS, hospital=f"h{position}"))
    streams = StreamSet(channels[0], hospitals, seed=seed)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=drive,
            args=(
                setup.role(setup.hospitals[h.ids.position]),
                FrameIO(
                    channels[1 + h.ids.position],
                    inbound=h.streams.down,
                    outbound=h.streams.up,
                    ids=h.ids,
                ),
                h.ids,
                errors,
            ),
        )
        for h in hospitals
    ]
    for thread in threads:
        thread.start()
    server = MultiStreamServer(
        streams, split=setup.split, party=setup.server, policy=policy, silence_timeout=20
    )
    report = server.run()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert report.steps == [STEPS, STEPS]
    assert sorted(report.served) == [(h, s) for h in range(2) for s in range(STEPS)]
    if policy == StepPolicy.ALL:
        # Every step of every stream, in the seeded order of that step: no timing in it.
        assert report.served == [(h, s) for s in range(STEPS) for h in streams.order(s)]
    return report.served


def sequential(setup: Setup, served: list[tuple[int, int]]) -> tuple[Party, list[dict]]:
    """The same steps, one after another in ``served``'s order, with no channel at all."""
    server, hospitals = copy.deepcopy(setup.fresh)
    roles = [setup.role(p) for p in hospitals]
    server_roles = [setup.mode.server_role(server, setup.split, job=JOB) for _ in hospitals]
    for h, step in served:
        x, y = batches(h)[step]
        frame: Frame | StepResult = roles[h].start(StepIds(JOB, 0, h, step), x, y)
        while isinstance(frame, Frame):
            frame = roles[h].receive(server_roles[h].handle(frame))
    return server, hospitals


def assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def check_exact(setup: Setup, served: list[tuple[int, int]]) -> None:
    server, hospitals = sequential(setup, served)
    assert_same(setup.server.module, server.module)
    for got, want in zip(setup.hospitals, hospitals, strict=True):
        for name in got:
            assert_same(got[name].module, want[name].module)
    untrained = setup.fresh[0].module.state_dict()
    assert any(not torch.equal(t, untrained[k]) for k, t in server.module.state_dict().items())


@pytest.mark.parametrize("policy", list(StepPolicy))
@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_two_streams_on_one_segment_equal_the_same_steps_in_sequence(
    mode: str, policy: StepPolicy
) -> None:
    setup = Setup(mode)
    channel = InMemoryChannel()
    served = serve(setup, [channel] * 3, policy, "mem")
    check_exact(setup, served)


@pytest.fixture
def redis_channels(redis_url: str) -> Iterator[list[RedisChannel]]:
    """The server's and each hospital's own connection to a real Redis."""
    channels = [RedisChannel(redis_url) for _ in range(3)]
    yield channels
    for channel in channels:
        channel.close()


@pytest.mark.parametrize("policy", list(StepPolicy))
def test_two_streams_over_redis_equal_the_same_steps_in_sequence(
    redis_channels: list[RedisChannel], policy: StepPolicy
) -> None:
    setup = Setup("ushaped")
    prefix = f"medsplit-test-multi-{uuid.uuid4()}"
    try:
        served = serve(setup, list(redis_channels), policy, prefix)
    finally:
        for position in range(2):
            for end in ("up", "down"):
                redis_channels[0].reset(f"{prefix}:{position}:{end}")
    check_exact(setup, served)


def test_the_order_of_each_cycle_comes_from_the_seed_only() -> None:
    hospitals = [
        HospitalStream(TurnIds(JOB, 0, p, "vanilla"), StreamPair(f"u{p}", f"d{p}"), 1)
        for p in range(5)
    ]
    a = StreamSet(InMemoryChannel(), hospitals, seed=3)
    b = StreamSet(InMemoryChannel(), hospitals, seed=3)
    assert [a.order(c) for c in range(6)] == [b.order(c) for c in range(6)]
    assert sorted(a.order(0)) == list(range(5))
    assert len({tuple(a.order(c)) for c in range(6)}) > 1, "the order changes by cycle"


def test_a_silent_stream_is_named() -> None:
    setup = Setup("vanilla")
    hospitals = [
        HospitalStream(TurnIds(JOB, 0, 0, "vanilla"), StreamPair("s:0:up", "s:0:down"), 1, "quiet")
    ]
    server = MultiStreamServer(
        StreamSet(InMemoryChannel(), hospitals),
        split=setup.split,
        party=setup.server,
        policy=StepPolicy.ALL,
        silence_timeout=0.3,
    )
    with pytest.raises(HospitalSilent, match=r"hospital quiet sent nothing .*\(all\)"):
        server.run()
