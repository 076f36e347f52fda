"""Turns over a relay between a TurnServer and a TurnClient: exact, and surviving a server
that dies, pauses or stops (invariants 1 and 4)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from medsplit.channel import InMemoryChannel
from medsplit.cutting import split_model
from medsplit.data import DataSplit, synthetic_split
from medsplit.errors import ProtocolError
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.reference import train_unsplit
from medsplit.training.verify import deterministic
from medsplit.turns import (
    HospitalSilent,
    MemoryCheckpointStore,
    ServerOutcome,
    TurnFailed,
    TurnIds,
    TurnServer,
    control,
)
from medsplit.turns.frameio import FrameIO
from medsplit.turns.states import (
    CLIENT_TRANSITIONS,
    SERVER_TRANSITIONS,
    ClientState,
    ServerState,
    TurnState,
    TurnStateError,
)
from medsplit.wire import FrameKind, encode_frame
from tests.medsplit.turn_harness import ScriptedHooks, run_over_relay
from tests.redis_server import session_keys

ADAM = OptimizerConfig(name="adam", lr=1e-3)
SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)
AUGMENT = ({"name": "flip"}, {"name": "rotate", "degrees": 20}, {"name": "shift_intensity"})


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2)
    )


def shares(n: int, parts: int) -> list[DataSplit]:
    data = synthetic_split(n * parts, shape=(1, 8, 8), seed=3)
    return [DataSplit(data.images[i::parts], data.labels[i::parts]) for i in range(parts)]


def config_for(mode: str, **overrides) -> TrainingConfig:
    cuts = ("2",) if mode == "vanilla" else ("2", "4")
    values = dict(
        cuts=cuts,
        mode=mode,
        client_optimizer=ADAM,
        server_optimizer=SGD,
        batch_size=8,
        rounds=2,
        job="job-turns",
    )
    return TrainingConfig(**{**values, **overrides})


def assert_equals_unsplit(job, model: nn.Module, splits: list[DataSplit], config: TrainingConfig):
    whole = train_unsplit(model, splits, config, job.split)
    got = job.state_dict()
    want = whole.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert not torch.equal(want["1.weight"], model.state_dict()["1.weight"]), "nothing trained"


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_a_job_over_the_relay_equals_unsplit_training(mode: str) -> None:
    model, splits, config = mlp(), shares(48, 3), config_for(mode)
    vals = shares(10, 3)
    with deterministic():
        job = run_over_relay(model, splits, config, InMemoryChannel(), vals=vals)
        assert_equals_unsplit(job, model, splits, config)
    assert job.outcomes == [ServerOutcome.COMPLETED] * 6
    assert all(r == [0] for r in job.resumed_at), "no turn needed a second handshake"
    for metrics in job.metrics:
        assert {"train_loss", "val_loss", "val_accuracy", "val_samples"} <= set(metrics)
        assert metrics["val_samples"] == 10
        assert 0.0 <= metrics["val_accuracy"] <= 1.0


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_a_server_that_dies_mid_turn_is_replaced_and_nothing_is_applied_twice(mode: str) -> None:
    """Killed after steps 4 and 5 of one turn (checkpoints every 3): the next server
    resumes from the checkpoint after step 2, the hospital rolls back to its snapshot
    before step 3, and the final weights still equal unsplit training exactly."""
    model, splits, config = mlp(), shares(48, 3), config_for(mode)
    scripts = {(0, 1): ScriptedHooks(crash_at={5}), (1, 2): ScriptedHooks(crash_at={4, 6})}

    def hooks_for(round_: int, position: int) -> ScriptedHooks:
        return scripts.get((round_, position), ScriptedHooks())

    with deterministic():
        job = run_over_relay(model, splits, config, InMemoryChannel(), hooks_for=hooks_for)
        assert_equals_unsplit(job, model, splits, config)
    resumed = dict(zip([(r, p) for r in range(2) for p in range(3)], job.resumed_at, strict=True))
    assert resumed[(0, 1)] == [0, 3]
    assert resumed[(1, 2)] == [0, 3, 3], "killed before the checkpoint after step 5 was written"
    assert scripts[(0, 1)].steps_seen[:6] == [1, 2, 3, 4, 5, 4]


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_pause_takes_effect_within_a_step_and_resume_continues_exactly(mode: str) -> None:
    model, splits, config = mlp(), shares(48, 3), config_for(mode, rounds=1)
    scripts = {1: ScriptedHooks(pause_at={4})}
    with deterministic():
        job = run_over_relay(
            model,
            splits,
            config,
            InMemoryChannel(),
            hooks_for=lambda r, p: scripts.get(p, ScriptedHooks()),
        )
        assert_equals_unsplit(job, model, splits, config)
    assert job.outcomes == [
        ServerOutcome.COMPLETED,
        ServerOutcome.PAUSED,
        ServerOutcome.COMPLETED,
        ServerOutcome.COMPLETED,
    ]
    assert job.resumed_at[1] == [0, 4], "paused before step 4, resumed there"
    assert scripts[1].steps_seen[:5] == [1, 2, 3, 4, 5]


def test_stop_ends_the_turn_on_both_sides() -> None:
    model, splits, config = mlp(), shares(48, 2), config_for("vanilla", rounds=1)
    job = run_over_relay(
        model,
        splits,
        config,
        InMemoryChannel(),
        hooks_for=lambda r, p: ScriptedHooks(stop_at={2}) if p == 1 else ScriptedHooks(),
    )
    assert job.outcomes == [ServerOutcome.COMPLETED, ServerOutcome.STOPPED]


# -- the server alone, against a scripted or absent hospital ----------------------------


def lone_server(channel: InMemoryChannel, **kwargs) -> TurnServer:
    config = config_for("vanilla")
    model = mlp()
    split = split_model(model, torch.zeros(2, 1, 8, 8), config.cuts)
    from medsplit.protocol.party import Party

    party = Party.create(split.segments[1], config.server_optimizer)
    return TurnServer(
        ids=TurnIds(config.job, 0, 0, "vanilla"),
        channel=channel,
        streams=session_keys().streams(config.job, "h0"),
        split=split,
        party=party,
        store=MemoryCheckpointStore(export_parties({"server": party})),
        hooks=ScriptedHooks(),
        batch_size=8,
        poll_interval=0.05,
        **kwargs,
    )


def test_a_hospital_that_never_shows_up_fails_the_turn_with_the_reason() -> None:
    server = lone_server(InMemoryChannel(), silence_timeout=0.3)
    with pytest.raises(HospitalSilent, match=r"sent nothing for .* \(silence timeout 0.3 s\)"):
        server.run()


def test_garbage_from_a_hospital_fails_the_turn_naming_what_was_wrong() -> None:
    channel = InMemoryChannel()
    server = lone_server(channel, silence_timeout=5)
    streams = session_keys().streams("job-turns", "h0")
    channel.send(streams.up, b"\x00garbage")
    with pytest.raises(TurnFailed, match="'well-formed' check: bytes that are not a frame"):
        server.run()
    from medsplit.wire import decode_frame

    sent = [decode_frame(channel.receive(streams.down, timeout=1)).meta.kind for _ in range(2)]
    assert sent == [FrameKind.SYNC, FrameKind.STOPPED], "the hospital is told, not left waiting"


def test_a_rejoin_without_the_starting_snapshot_cannot_resume() -> None:
    channel = InMemoryChannel()
    server = lone_server(channel, silence_timeout=5)
    ids = server.ids
    streams = server.streams
    outcome: dict[str, object] = {}

    def serve() -> None:
        try:
            server.run()
        except TurnFailed as e:
            outcome["error"] = e

    thread = threading.Thread(target=serve)
    thread.start()
    from medsplit.wire import decode_frame

    sync = decode_frame(channel.receive(streams.down, timeout=5))
    assert sync.meta.kind == FrameKind.SYNC
    # A hospital that offers only a snapshot the server has no checkpoint for.
    channel.send(streams.up, encode_frame(control.rejoin(ids, control.nonce_of(sync), [7])))
    thread.join(5)
    assert "no common point to resume from" in str(outcome["error"])


def test_metrics_frames_are_checked() -> None:
    ids = TurnIds("j", 0, 0, "vanilla")
    good = control.metrics(ids, 3, {"val_accuracy": 0.5})
    assert control.metric_values(good) == {"val_accuracy": 0.5}
    with pytest.raises(ProtocolError, match="not finite"):
        control.metric_values(control.metrics(ids, 3, {"val_loss": float("nan")}))
    with pytest.raises(ProtocolError, match="lower-case name"):
        control.metric_values(control.metrics(ids, 3, {"Bad Name": 1.0}))


@pytest.mark.parametrize("augmentation", [(), AUGMENT], ids=["plain", "augmented"])
def test_a_hospital_asked_to_stop_finishes_its_step_and_comes_back_exactly(augmentation) -> None:
    """SIGTERM at the agent: the step in flight is finished, a snapshot kept, and the
    next run says hello and continues from there; training stays exact (augmented too:
    the resumed run draws each step's transforms again from the step's own seed)."""
    import copy

    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import client_parties, server_party
    from medsplit.turns import ClientOutcome, MemorySnapshots, TurnClient
    from tests.medsplit.turn_harness import ScriptedHooks

    model, (data,) = mlp(), shares(48, 1)
    config = config_for("vanilla", rounds=1, augmentation=augmentation)
    channel = InMemoryChannel()
    split = split_model(model, data.images[:2], config.cuts)
    ids = TurnIds(config.job, 0, 0, "vanilla")
    streams = session_keys().streams(config.job, "h0")
    party = server_party(split, config)
    server = TurnServer(
        ids=ids, channel=channel, streams=streams, split=split, party=party,
        store=MemoryCheckpointStore(export_parties({"server": copy.deepcopy(party)})),
        hooks=ScriptedHooks(), batch_size=8, checkpoint_every=4, poll_interval=0.05,
    )  # fmt: skip
    thread = threading.Thread(target=server.run)
    stop = threading.Event()
    client = TurnClient(
        ids=ids, channel=channel, streams=streams, split=split,
        parties=lambda: client_parties(split, config),
        start=export_parties(client_parties(split, config)), config=config, train=data,
        val=None, snapshots=MemorySnapshots(), reply_timeout=10, stop=stop, device="cpu",
        on_step=lambda result: stop.set() if result.ids.step == 1 else None,
    )  # fmt: skip
    with deterministic():
        thread.start()
        first = client.run()
        assert first.outcome == ClientOutcome.INTERRUPTED and first.steps == 2
        assert 2 in client.snapshots.steps(), "a snapshot before the next step"
        stop.clear()
        second = client.run()
        thread.join(10)
        assert second.outcome == ClientOutcome.COMPLETED
        assert client.resumed_at == [0, 2]
        whole = train_unsplit(model, [data], config, split).state_dict()
    got = {**party.module.state_dict(), **client.parties["front"].module.state_dict()}
    for name, value in whole.items():
        assert torch.equal(got[name], value), name


def test_a_traced_split_is_shared_but_every_party_trains_its_own_copy() -> None:
    from medsplit.training.setup import JobModel, cached_split, client_parties, server_party

    model = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), seed=3)
    config = config_for("vanilla", cuts=("pool1",))
    split = cached_split(model, ("pool1",))
    assert cached_split(model, ("pool1",)) is split, "traced once per process"
    first, second = server_party(split, config), server_party(split, config)
    for a, b in zip(first.module.parameters(), second.module.parameters(), strict=True):
        assert a is not b and torch.equal(a, b)
    front = client_parties(split, config)["front"].module
    assert all(
        p is not q for p, q in zip(front.parameters(), split.segments[0].parameters(), strict=True)
    )


def _one_turn(*, stop_after: int | None) -> tuple[list[float], list, list]:
    """One vanilla turn over an in-memory relay; with ``stop_after``, the hospital's
    process stops after that step and a *new* one (same snapshots, as a restarted agent)
    finishes the turn. Returns the reported train losses, and the server's resumes."""
    import copy

    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import client_parties, server_party
    from medsplit.turns import ClientOutcome, MemorySnapshots, TurnClient
    from tests.medsplit.turn_harness import ScriptedHooks

    model, (data,), config = mlp(), shares(48, 1), config_for("vanilla", rounds=1)
    channel = InMemoryChannel()
    split = split_model(model, data.images[:2], config.cuts)
    ids = TurnIds(config.job, 0, 0, "vanilla")
    streams = session_keys().streams(config.job, "h0")
    party = server_party(split, config)
    hooks = ScriptedHooks()
    server = TurnServer(
        ids=ids, channel=channel, streams=streams, split=split, party=party,
        store=MemoryCheckpointStore(export_parties({"server": copy.deepcopy(party)})),
        hooks=hooks, batch_size=8, checkpoint_every=2, poll_interval=0.05,
    )  # fmt: skip
    snapshots = MemorySnapshots()
    stop = threading.Event()

    def hospital() -> TurnClient:
        return TurnClient(
            ids=ids, channel=channel, streams=streams, split=split,
            parties=lambda: client_parties(split, config),
            start=export_parties(client_parties(split, config)), config=config, train=data,
            val=None, snapshots=snapshots, reply_timeout=10, stop=stop, device="cpu",
            on_step=lambda r: stop.set() if stop_after is not None and r.ids.step == stop_after
            else None,
        )  # fmt: skip

    thread = threading.Thread(target=server.run)
    with deterministic():
        thread.start()
        report = hospital().run()
        if stop_after is not None:
            assert report.outcome == ClientOutcome.INTERRUPTED
            stop.clear()
            stop_after = None
            report = hospital().run()  # a new process: nothing of the first in memory
        thread.join(10)
    assert report.outcome == ClientOutcome.COMPLETED
    return [report.metrics["train_loss"]], hooks.resumes, hooks.finished


def test_a_restarted_hospital_reports_the_loss_of_the_whole_turn_and_the_resume_is_told() -> None:
    """Before: a restarted agent reported the loss of the steps since it came back only."""
    undisturbed, no_resumes, _ = _one_turn(stop_after=None)
    restarted, resumes, finished = _one_turn(stop_after=1)
    assert restarted == undisturbed
    assert finished[0]["train_loss"] == undisturbed[0]
    assert no_resumes == []
    assert resumes == [(2, "the hospital came back")]


# -- the state tables and the frame I/O both sides share --------------------------------


@pytest.mark.parametrize(
    ("table", "states"),
    [(SERVER_TRANSITIONS, ServerState), (CLIENT_TRANSITIONS, ClientState)],
)
def test_every_state_is_in_its_sides_table_and_every_end_is_final(table, states) -> None:
    assert set(table) == set(states)
    assert all(to <= set(states) for to in table.values())
    ends = {s for s in states if s.value in {"completed", "paused", "stopped", "failed"}}
    assert all(not table[s] for s in ends)


def test_an_illegal_transition_is_a_clear_turn_state_error() -> None:
    state = TurnState(SERVER_TRANSITIONS, ServerState.STARTING, side="server")
    state.to(ServerState.HANDSHAKE)
    with pytest.raises(TurnStateError, match=r"server's side .* from 'handshake' to 'mid_step'"):
        state.to(ServerState.MID_STEP)
    assert state.now == ServerState.HANDSHAKE, "a refused transition changes nothing"
    state.to(ServerState.TRAINING)
    state.to(ServerState.COMPLETED)
    with pytest.raises(TurnStateError, match=r"may go to: none \(a final state\)"):
        state.to(ServerState.TRAINING)


def test_frame_io_drops_and_counts_frames_of_another_turn() -> None:
    channel = InMemoryChannel()
    ids = TurnIds("job-io", 0, 1, "vanilla")
    other = TurnIds("job-io", 0, 2, "vanilla")
    io = FrameIO(channel, inbound="in", outbound="out", ids=ids)
    channel.send("in", encode_frame(control.sync(other, 5)))
    channel.send("in", encode_frame(control.sync(ids, 6)))
    assert io.receive(0.1) is None
    frame = io.receive(0.1)
    assert frame is not None and control.nonce_of(frame) == 6
    assert io.receive(0.05) is None, "nothing more: a timeout is None too"
    assert (io.counters.frames_in, io.counters.dropped) == (2, 1)
    size = io.send(control.sync(ids, 7))
    assert (io.counters.frames_out, io.counters.bytes_out) == (1, size)
    with pytest.raises(FrameRejected, match="not a frame"):
        channel.send("in", b"garbage")
        io.receive(0.1)
