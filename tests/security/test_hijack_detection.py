"""A hijacking server against a real hospital over real Redis: caught, and nothing after.

The attacker is the test harness's feature-space hijacker (``tests/hijack_server.py``)
in a real :class:`~medsplit.turns.TurnServer`; the hospital is a real
:class:`~medsplit.turns.TurnClient` with the job's ``hijack_detection`` on (SplitOut,
then SplitGuard).
"""

from __future__ import annotations

import uuid

import pytest
import torch

from medsplit.channel import RedisChannel
from medsplit.cutting import split_model
from medsplit.data import synthetic_split
from medsplit.defenses import HijackDetection, PrivacyOptions
from medsplit.defenses.hijack import HijackDetected
from medsplit.defenses.splitguard import SplitGuardDetected, is_probe
from medsplit.models import build_model
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.turns import ClientOutcome
from medsplit.turns.hijack_guard import SplitGuardCheck
from tests.hijack_server import FeatureSpaceHijacker, HijackRun, run_turn
from tests.redis_server import session_keys

TRAIN = synthetic_split(64, seed=0)
AUX = synthetic_split(64, seed=1)
CUT = "pool1"


def _turn(redis_url: str, *, hijack: bool) -> HijackRun:
    adam = OptimizerConfig(name="adam", lr=1e-3)
    config = TrainingConfig(
        cuts=(CUT,),
        mode="vanilla",
        client_optimizer=adam,
        server_optimizer=adam,
        batch_size=16,
        job=f"hijack-{uuid.uuid4().hex[:12]}",
        privacy=PrivacyOptions(hijack_detection=HijackDetection(honest_records=48)),
    )
    model = build_model("small_cnn", spatial_dims=2, in_channels=1, num_classes=2, seed=0)
    split = split_model(model, TRAIN.images[:2], (CUT,))
    attacker = (
        FeatureSpaceHijacker(boundary=split.boundaries[0], aux=AUX.images, seed=0, lr=1e-3)
        if hijack
        else None
    )
    channel = RedisChannel(redis_url)
    streams = session_keys().streams(config.job, "h0")
    try:
        return run_turn(
            channel=channel,
            streams=streams,
            split=split,
            config=config,
            train=TRAIN,
            attacker=attacker,
            timeout=10.0,
        )
    finally:
        for stream in (streams.up, streams.down):
            channel.reset(stream)
        channel.close()


def test_a_hijacking_server_is_caught_and_no_further_step_is_applied(redis_url: str) -> None:
    run = _turn(redis_url, hijack=True)
    assert run.detected is not None
    # Every step before the tripping one was applied, the tripping one was not.
    assert run.applied == list(range(run.detected.step))
    assert run.client.position == run.detected.step
    # The front is as the last applied step left it: nothing of the tripping frame.
    front = run.client.parties["front"].module.state_dict()
    assert run.weights.keys() == front.keys()
    assert all(torch.equal(run.weights[k], front[k]) for k in front)
    with pytest.raises(HijackDetected):
        run.client.run()  # the hospital refuses every further step of the job


def test_an_honest_server_is_not_flagged(redis_url: str) -> None:
    run = _turn(redis_url, hijack=False)
    assert run.detected is None
    assert run.report is not None and run.report.outcome == ClientOutcome.COMPLETED
    assert run.applied == list(range(run.client.train_steps))


# -- SplitGuard: fake-label probes (vanilla mode) -------------------------------------

GUARD_TRAIN = synthetic_split(512, seed=0)  # 32 steps: enough probes at 15 %


def _splitguard_turn(redis_url: str, *, hijack: bool) -> HijackRun:
    adam = OptimizerConfig(name="adam", lr=1e-3)
    config = TrainingConfig(
        cuts=(CUT,),
        mode="vanilla",
        client_optimizer=adam,
        server_optimizer=adam,
        batch_size=16,
        job=f"splitguard-{uuid.uuid4().hex[:12]}",
        privacy=PrivacyOptions(
            hijack_detection=HijackDetection(method="splitguard", probe_probability=0.15)
        ),
    )
    model = build_model("small_cnn", spatial_dims=2, in_channels=1, num_classes=2, seed=0)
    split = split_model(model, GUARD_TRAIN.images[:2], (CUT,))
    attacker = (
        FeatureSpaceHijacker(boundary=split.boundaries[0], aux=AUX.images, seed=0, lr=1e-3)
        if hijack
        else None
    )
    channel = RedisChannel(redis_url)
    streams = session_keys().streams(config.job, "h0")
    try:
        return run_turn(
            channel=channel,
            streams=streams,
            split=split,
            config=config,
            train=GUARD_TRAIN,
            attacker=attacker,
            timeout=10.0,
        )
    finally:
        for stream in (streams.up, streams.down):
            channel.reset(stream)
        channel.close()


def _probes(run: HijackRun, steps: int) -> list[int]:
    guard = run.client.guard
    assert isinstance(guard, SplitGuardCheck)
    return [
        s
        for s in range(steps)
        if is_probe(
            seed=0,
            round_=0,
            step=s,
            probability=guard.options.probe_probability,
            start=guard.options.start_step,
        )
    ]


def test_splitguard_catches_a_hijacking_server_and_applies_no_fake_batch(
    redis_url: str,
) -> None:
    run = _splitguard_turn(redis_url, hijack=True)
    assert isinstance(run.detected, SplitGuardDetected)
    assert "SplitGuard's score" in str(run.detected)
    probes = _probes(run, run.detected.step + 1)
    assert run.detected.step == probes[-1]  # a fake batch's score tripped it
    assert run.detected.probes == len(probes) >= 3
    # Every regular step before it was applied; no fake batch was (its front put back).
    assert run.applied == [s for s in range(run.detected.step) if s not in probes]
    # The front is exactly as the last regular step left it: the fake ones after it undone.
    front = run.client.parties["front"].module.state_dict()
    assert all(torch.equal(run.weights[k], front[k]) for k in front)
    with pytest.raises(HijackDetected):
        run.client.run()


def test_splitguard_does_not_flag_an_honest_server(redis_url: str) -> None:
    run = _splitguard_turn(redis_url, hijack=False)
    assert run.detected is None
    assert run.report is not None and run.report.outcome == ClientOutcome.COMPLETED
    probes = _probes(run, run.client.train_steps)
    assert len(probes) >= 3
    assert run.applied == [s for s in range(run.client.train_steps) if s not in probes]
    guard = run.client.guard
    assert isinstance(guard, SplitGuardCheck)
    assert all(score >= guard.options.threshold for _, score in guard.detector.scores[2:])
