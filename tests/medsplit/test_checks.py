"""The value checks of every frame (invariant 5): each refusal names its check, and a
refused frame changes no weight or batch statistic on either side."""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import OrderedDict

import pytest
import torch

from medsplit.channel import InMemoryChannel
from medsplit.cutting import split_model
from medsplit.errors import ProtocolError
from medsplit.models import build_model
from medsplit.modes import get_mode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LOSS, StepIds
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.turns import FrameRefused, MemoryCheckpointStore, TurnIds, TurnServer, control
from medsplit.wire import Frame, FrameKind, FrameMeta, decode_frame, encode_frame
from tests.medsplit.turn_harness import ScriptedHooks
from tests.redis_server import session_keys

SGD = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
JOB = "job-checks"
LIMITS = FrameLimits(batch_size=4, num_classes=2, train_steps=3, val_samples=6)


def meta(kind: FrameKind, step: int) -> FrameMeta:
    return FrameMeta(job=JOB, round=0, position=0, step=step, kind=kind, mode="vanilla")


def frame(kind: FrameKind = FrameKind.ACTIVATIONS, step: int = 0, **tensors) -> Frame:
    return Frame(meta(kind, step), tensors)


# -- the checks on their own ------------------------------------------------------------


def test_limits_know_the_turns_steps_and_validation_batches() -> None:
    assert (LIMITS.eval_steps, LIMITS.metrics_step) == (2, 5)
    assert [LIMITS.eval_batch(i) for i in range(3)] == [4, 2, 0]
    unknown = FrameLimits(batch_size=4)
    assert (unknown.eval_steps, unknown.metrics_step, unknown.eval_batch(0)) == (None, None, None)
    config = TrainingConfig(cuts=("x",), batch_size=16, max_steps_per_turn=5, drop_last=False)
    limits = turn_limits(config, num_classes=3, train=40, val=17)
    assert (limits.train_steps, limits.eval_steps, limits.exact_batch) == (3, 2, False)
    for bad in ({"batch_size": 0}, {"batch_size": 4, "num_classes": 0}, {"batch_size": True}):
        with pytest.raises(ValueError, match="must be an integer"):
            FrameLimits(**bad)


def test_a_refusal_names_the_check_the_frame_and_once_known_the_sender() -> None:
    refused = FrameRejected.of(frame(step=3), checks.FINITE, "tensor 'a' holds NaN")
    assert refused.check == "finite" and isinstance(refused, ProtocolError)
    assert (
        str(refused)
        == "activations frame for step 3 failed the 'finite' check: tensor 'a' holds NaN"
    )
    named = refused.sent_by("hospital general")
    assert str(named).startswith("hospital general's activations frame for step 3 failed")


def test_non_finite_values_are_refused_naming_the_tensor() -> None:
    checks.check_finite(frame(a=torch.ones(2, 3), labels=torch.tensor([0, 1])))
    # Large but finite values pass, though their sum overflows.
    checks.check_finite(frame(a=torch.full((10,), 3e38), b=torch.full((9,), 6e4).half()))
    for bad in (torch.nan, torch.inf, -torch.inf):
        x = torch.ones(2, 3)
        x[1, 2] = bad
        with pytest.raises(FrameRejected, match="'a' holds 1 non-finite") as e:
            checks.check_finite(frame(a=x))
        assert e.value.check == checks.FINITE


def test_batches_are_the_jobs_size_and_no_larger() -> None:
    f = frame(a=torch.ones(4, 2))
    checks.check_training_batch(f, 4, LIMITS)
    for samples in (0, 3, 5, 4096):
        with pytest.raises(FrameRejected) as e:
            checks.check_training_batch(f, samples, LIMITS)
        assert e.value.check == checks.BATCH
    at_most = FrameLimits(batch_size=4, exact_batch=False)
    checks.check_training_batch(f, 3, at_most)  # a last short batch, without drop_last
    with pytest.raises(FrameRejected, match="at most 4"):
        checks.check_training_batch(f, 5, at_most)
    with pytest.raises(FrameRejected, match="disagree"):
        checks.batch_of(frame(a=torch.ones(4, 2), labels=torch.zeros(3, dtype=torch.int64)))
    checks.check_eval_batch(f, 2, LIMITS, 1)  # the last validation batch of 6 is 2
    with pytest.raises(FrameRejected, match="validation batch 1 holds 4"):
        checks.check_eval_batch(f, 4, LIMITS, 1)


def test_labels_are_classes_of_the_job() -> None:
    f = frame()
    checks.check_labels(f, torch.tensor([0, 1, 1]), LIMITS)
    for labels in ([0, 2], [-1, 0], [7]):
        with pytest.raises(FrameRejected, match=r"classes 0\.\.1") as e:
            checks.check_labels(f, torch.tensor(labels), LIMITS)
        assert e.value.check == checks.LABELS
    checks.check_labels(f, torch.tensor([7]), FrameLimits(batch_size=4))  # classes unknown


def test_steps_stay_within_the_turn() -> None:
    checks.check_training_step(frame(step=2), LIMITS)
    with pytest.raises(FrameRejected, match="past the turn's 3 training steps"):
        checks.check_training_step(frame(step=3), LIMITS)
    assert checks.check_eval_step(frame(FrameKind.EVAL_ACTIVATIONS, 4), LIMITS) == 1
    for step, words in ((2, "before the turn's 3 training steps"), (5, "past the 2 batches")):
        with pytest.raises(FrameRejected, match=words) as e:
            checks.check_eval_step(frame(FrameKind.EVAL_ACTIVATIONS, step), LIMITS)
        assert e.value.check == checks.STEPS
    checks.check_metrics_step(frame(FrameKind.METRICS, 5), LIMITS)
    for step, words in ((0, "complete after 0 of its 3"), (3, "belong at step 5")):
        with pytest.raises(FrameRejected, match=words):
            checks.check_metrics_step(frame(FrameKind.METRICS, step), LIMITS)
    # A hospital with less than a batch of data has a turn of zero training steps.
    zero = FrameLimits(batch_size=4, train_steps=0, val_samples=0)
    checks.check_metrics_step(frame(FrameKind.METRICS, 0), zero)
    unknown = FrameLimits(batch_size=4)
    checks.check_training_step(frame(step=10**6), unknown)
    assert checks.check_eval_step(frame(FrameKind.EVAL_ACTIVATIONS, 0), unknown) is None


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"val_samples": 7.0}, "more than the 6 validation samples"),
        ({"val_samples": 2.5}, "whole number"),
        ({"val_accuracy": 1.01}, r"\[0, 1\]"),
        ({"val_auc": -0.1}, r"\[0, 1\]"),
        ({"train_loss": -1.0}, "cannot be negative"),
        ({"val_loss": float("inf")}, "not a finite number"),
    ],
)
def test_metrics_that_cannot_be_true_are_refused(values: dict, words: str) -> None:
    with pytest.raises(FrameRejected, match=words) as e:
        checks.check_metrics(frame(FrameKind.METRICS, 5), values, LIMITS)
    assert e.value.check == checks.METRICS


def test_metrics_that_can_be_true_pass() -> None:
    values = {"train_loss": 0.7, "val_loss": 0.0, "val_accuracy": 1.0, "val_auc": 0.0}
    checks.check_metrics(frame(FrameKind.METRICS, 5), {**values, "val_samples": 6.0}, LIMITS)


def test_logits_have_the_batch_and_the_classes_of_the_job() -> None:
    f = frame(FrameKind.EVAL_OUTPUTS, 3)
    checks.check_logits(f, torch.zeros(4, 2), 4, LIMITS)
    for logits, check in (
        (torch.zeros(4, 5), checks.SHAPE),
        (torch.zeros(4, 2, 1), checks.SHAPE),
        (torch.zeros(4, 2, dtype=torch.int64), checks.SHAPE),
        (torch.zeros(3, 2), checks.BATCH),
        (torch.full((4, 2), torch.nan), checks.FINITE),
    ):
        with pytest.raises(FrameRejected) as e:
            checks.check_logits(f, logits, 4, LIMITS)
        assert e.value.check == check, logits.shape


# -- the roles: a refused frame changes nothing -------------------------------------------


def state(*modules: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]


def assert_same(before: list[dict[str, torch.Tensor]], *modules: torch.nn.Module) -> None:
    for saved, module in zip(before, modules, strict=True):
        assert any("running_mean" in k for k in saved), "a batch norm to put back"
        for name, value in module.state_dict().items():
            assert torch.equal(saved[name], value), f"{name} changed"
        assert all(p.grad is None for p in module.parameters()), "no gradient left behind"


def bn_net() -> torch.nn.Module:
    """Every segment holds a batch norm, whose running statistics a forward changes."""
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(1, 4, 3, padding=1),
            bn1=nn.BatchNorm2d(4),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(4, 8, 3, padding=1),
            bn2=nn.BatchNorm2d(8),
            relu=nn.ReLU(),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            bn3=nn.BatchNorm1d(8),
            fc=nn.Linear(8, 2),
        )
    )


def roles(mode: str, limits: FrameLimits | None = LIMITS):  # type: ignore[no-untyped-def]
    cuts = ("pool1",) if mode == "vanilla" else ("pool1", "pool")
    split = split_model(bn_net(), torch.zeros(2, 1, 16, 16), cuts)
    names = {"front": 0} if mode == "vanilla" else {"front": 0, "head": 2}
    parties = {n: Party.create(copy.deepcopy(split.segments[i]), SGD) for n, i in names.items()}
    server = get_mode(mode).server_role(
        Party.create(split.segments[1], SGD), split, job=JOB, limits=limits
    )
    return get_mode(mode).client_role(parties, split), server, parties, server_module(server)


def server_module(server) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    return (server.tail if hasattr(server, "tail") else server.middle).module


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.rand(4, 1, 16, 16, generator=gen), torch.randint(0, 2, (4,), generator=gen)


def replace(f: Frame, **tensors: torch.Tensor) -> Frame:
    return Frame(f.meta, {**f.tensors, **tensors})


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (lambda f: replace(f, pool1=torch.full_like(f.tensors["pool1"], torch.nan)), "finite"),
        # Finite, but so large that the server's own loss and gradients overflow.
        (lambda f: replace(f, pool1=torch.full_like(f.tensors["pool1"], 3e38)), "finite"),
        (lambda f: replace(f, labels=torch.tensor([0, 1, 7, 0])), "labels in range"),
        (
            lambda f: Frame(f.meta, {k: torch.cat([t] * 2) for k, t in f.tensors.items()}),
            "batch size",
        ),
        (lambda f: replace(f, pool1=f.tensors["pool1"].double()), "shape"),
        (lambda f: Frame(dataclasses.replace(f.meta, step=3), f.tensors), "step limit"),
    ],
    ids=["nan", "overflowing", "labels", "batch", "dtype", "step"],
)
def test_the_vanilla_server_refuses_before_anything_changes(change, check: str) -> None:
    client, server, _, back = roles("vanilla")
    x, y = batch()
    good = client.start(StepIds(JOB, 0, 0, 0), x, y)
    before = state(back)
    with pytest.raises(FrameRejected) as e:
        server.handle(change(good))
    assert e.value.check == check, e.value
    assert_same(before, back)
    reply = server.handle(good)  # the same step, honest, still goes through
    assert reply.meta.kind == FrameKind.GRADIENTS and torch.isfinite(reply.tensors[LOSS])


def test_the_ushaped_server_refuses_bad_head_gradients_and_undoes_its_forward() -> None:
    client, server, _, middle = roles("ushaped")
    x, y = batch()
    before = state(middle)
    head_activations = server.handle(client.start(StepIds(JOB, 0, 0, 0), x, y))
    head_gradients = client.receive(head_activations)
    assert isinstance(head_gradients, Frame)
    nan = {k: torch.full_like(t, torch.nan) for k, t in head_gradients.tensors.items()}
    with pytest.raises(FrameRejected, match="'finite' check"):
        server.handle(Frame(head_gradients.meta, nan))
    assert_same(before, middle)  # batch statistics of the forward are put back


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_a_client_refuses_non_finite_or_ill_shaped_gradients_and_applies_nothing(
    mode: str,
) -> None:
    for bad in (
        lambda t: torch.full_like(t, torch.nan),
        lambda t: t[:, :, :-1],
        lambda t: t[:-1],
    ):
        client, server, parties, _ = roles(mode)
        modules = [p.module for p in parties.values()]
        before = state(*modules)
        x, y = batch()
        reply = server.handle(client.start(StepIds(JOB, 0, 0, 0), x, y))
        if mode == "ushaped":
            reply = server.handle(client.receive(reply))
        tampered = {k: t if k == LOSS else bad(t) for k, t in reply.tensors.items()}
        with pytest.raises(FrameRejected):
            client.receive(Frame(reply.meta, tampered))
        assert_same(before, *modules)  # the head's step waits for the front's, too


def test_a_ushaped_client_refuses_non_finite_head_activations() -> None:
    client, server, parties, _ = roles("ushaped")
    modules = [p.module for p in parties.values()]
    before = state(*modules)
    x, y = batch()
    reply = server.handle(client.start(StepIds(JOB, 0, 0, 0), x, y))
    nan = {k: torch.full_like(t, torch.nan) for k, t in reply.tensors.items()}
    with pytest.raises(FrameRejected, match="'finite' check"):
        client.receive(Frame(reply.meta, nan))
    assert_same(before, *modules)


# -- the turn's driver: the reviewer's gaps ------------------------------------------------


def lone_server(channel: InMemoryChannel) -> TurnServer:
    model = build_model("small_cnn", spatial_dims=2, in_channels=1, num_classes=2, seed=0)
    split = split_model(model, torch.zeros(2, 1, 16, 16), ("pool1",))
    party = Party.create(split.segments[1], SGD)
    return TurnServer(
        ids=TurnIds(JOB, 0, 0, "vanilla"),
        channel=channel,
        streams=session_keys().streams(JOB, "general"),
        split=split,
        party=party,
        store=MemoryCheckpointStore(export_parties({"server": party})),
        hooks=ScriptedHooks(),
        limits=LIMITS,
        hospital="general",
        poll_interval=0.05,
        silence_timeout=5,
    )


def test_a_rejoin_without_a_scalar_nonce_fails_the_turn_naming_the_check() -> None:
    channel = InMemoryChannel()
    server = lone_server(channel)
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            server.run()
        except FrameRefused as e:
            failed.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    sync = decode_frame(channel.receive(server.streams.down, timeout=5))
    assert sync.meta.kind == FrameKind.SYNC
    rejoin = control.rejoin(server.ids, control.nonce_of(sync), [0])
    broken = Frame(rejoin.meta, {**rejoin.tensors, control.NONCE: torch.tensor([1, 2])})
    channel.send(server.streams.up, encode_frame(broken))
    thread.join(5)
    (error,) = failed
    assert error.check == "shape" and "hospital general's rejoin frame" in str(error)
    stopped = decode_frame(channel.receive(server.streams.down, timeout=5))
    assert stopped.meta.kind == FrameKind.STOPPED, "the hospital is told the turn is over"


def test_signals_carry_no_tensors() -> None:
    ids = TurnIds(JOB, 0, 0, "vanilla")
    done = control.signal(ids, FrameKind.DONE, 4)
    checks.conforms(done, control.SIGNAL_SPEC)
    with pytest.raises(FrameRejected, match="'shape' check"):
        checks.conforms(Frame(done.meta, {"x": torch.zeros(1)}), control.SIGNAL_SPEC)


def test_labels_in_a_frame_are_still_int64_only() -> None:
    """Labels cannot be non-finite: they cross as int64, and a float label is refused."""
    client, server, _, _ = roles("vanilla")
    x, y = batch()
    good = client.start(StepIds(JOB, 0, 0, 0), x, y)
    with pytest.raises(FrameRejected, match=r"'shape' check.*labels"):
        server.handle(replace(good, labels=torch.tensor([0.0, torch.nan, 1.0, 0.0])))
