"""A hostile party of a vertical evaluation against the real server side over the real
Redis: frames for other records (count, order), of another shape, with NaN, or from
another turn. Each is refused naming the party and the check (or, from another turn,
dropped unused); every party is told ``stopped``, no figure comes out and no weight of
any party changes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
import torch

from medsplit.channel import Channel
from medsplit.channel.redis import RedisChannel
from medsplit.turns.vertical_eval import (
    DIGEST_WORDS,
    RECORDS,
    VerticalEvalFailed,
    alignment_scalars,
    evaluate_vertical_party,
)
from medsplit.wire import Frame, FrameKind, decode_frame, encode_frame
from tests.medsplit.vertical_eval_harness import (
    aligned_test_records,
    run_evaluation,
    snapshot,
    unsplit_logits,
    vertical_setup,
)

OTHER_ORDER = alignment_scalars(hashlib.sha256(b"another order").hexdigest(), 37)


def send_forged(channel: Channel, party: dict, *, position: int) -> None:
    """The hostile party slips in a first test batch as if from ``position``: huge
    activations that would show in every logit if they were joined."""
    meta = party["ids"].at(0).meta(FrameKind.EVAL_ACTIVATIONS, "vertical", "none")
    forged = Frame(
        type(meta)(**{**meta.__dict__, "position": position}),
        {"pool1": torch.full((16, 16, 14, 14), 1e6), **alignment_scalars("00" * 32, 37)},
    )
    channel.send(party["streams"].up, encode_frame(forged))


class Tampering(Channel):
    """The hostile party's relay: what it sends passes through ``tamper`` first."""

    def __init__(self, inner: Channel, tamper: Callable[[Frame], Frame]) -> None:
        self.inner, self.tamper = inner, tamper

    def send(self, stream: str, payload: bytes) -> None:
        frame = decode_frame(payload)
        if frame.meta.kind == FrameKind.EVAL_ACTIVATIONS:
            frame = self.tamper(frame)
        self.inner.send(stream, encode_frame(frame))

    def receive(self, stream: str, *, timeout: float) -> bytes:
        return self.inner.receive(stream, timeout=timeout)

    def reset(self, stream: str) -> None:
        self.inner.reset(stream)


def _with(frame: Frame, **tensors: torch.Tensor) -> Frame:
    return Frame(frame.meta, {**frame.tensors, **tensors})


def _nan(frame: Frame) -> Frame:
    t = frame.tensors["pool1"].clone()
    t[0, 0, 0, 0] = float("nan")
    return _with(frame, pool1=t)


ATTACKS: dict[str, tuple[Callable[[Frame], Frame], str]] = {
    "fewer records": (lambda f: _with(f, **{RECORDS: torch.tensor(36)}), "batch size"),
    "another order": (lambda f: _with(f, **{w: OTHER_ORDER[w] for w in DIGEST_WORDS}), "batch"),
    "a short batch": (lambda f: _with(f, pool1=f.tensors["pool1"][:-1]), "batch size"),
    "a wrong shape": (
        lambda f: _with(f, pool1=torch.zeros(len(f.tensors["pool1"]), 3, 14, 14)),
        "shape",
    ),
    "a wrong dtype": (lambda f: _with(f, pool1=f.tensors["pool1"].double()), "shape"),
    "NaN": (_nan, "finite"),
    "a label from a passive party": (
        lambda f: _with(f, labels=torch.zeros(len(f.tensors["pool1"]), dtype=torch.int64)),
        "shape",
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_party_is_refused_by_name_and_nothing_changes(
    attack: str, redis_url: str
) -> None:
    tamper, check = ATTACKS[attack]
    model, parties, _ = vertical_setup("hospital")
    features, y = aligned_test_records()
    before = snapshot(parties)
    channel = RedisChannel(redis_url)

    def hostile(**kwargs):
        return evaluate_vertical_party(**{**kwargs, "channel": Tampering(channel, tamper)})

    job = f"job-attack-{abs(hash(attack)) % 10**6}"
    run = run_evaluation(
        channel,
        model,
        parties,
        features,
        y,
        labels_at_server=False,
        party=hostile,
        hostile="h2",
        job=job,
        timeout=10.0,
    )
    assert run.served is not None and run.served.figures is None
    assert "h2's eval_activations frame" in run.served.refused, run.served.refused
    assert f"{check!r} check" in run.served.refused or check in run.served.refused
    assert all(isinstance(e, VerticalEvalFailed) for e in run.errors.values()), run.errors
    assert set(run.errors) == {"h1", "h2"}, "a party was not told the evaluation stopped"
    after = snapshot(parties)
    assert all(torch.equal(before[k], after[k]) for k in before), "a weight changed"


def test_a_frame_of_another_turn_is_dropped_unused(redis_url: str) -> None:
    """A frame for another position (a non-participant's, a replay of another turn's)
    never enters the join: the evaluation goes on with the party's own frames."""
    model, parties, _ = vertical_setup("server")
    features, y = aligned_test_records()
    channel = RedisChannel(redis_url)
    stranger = {"done": False}

    def hostile(**kwargs):
        if not stranger["done"]:
            send_forged(channel, kwargs, position=5)
            stranger["done"] = True
        return evaluate_vertical_party(**kwargs)

    run = run_evaluation(
        channel,
        model,
        parties,
        features,
        y,
        labels_at_server=True,
        party=hostile,
        hostile="h2",
        job="job-stranger",
        timeout=10.0,
    )
    assert not run.errors and run.served is not None and not run.served.refused
    assert run.served.counters["h2"].dropped == 1
    assert run.served.figures["val_samples"] == len(y)


@pytest.mark.parametrize("attack", ["fewer records", "another order", "a wrong shape", "NaN"])
def test_a_hostile_passive_party_of_a_prediction_is_refused_by_name(
    attack: str, redis_url: str
) -> None:
    """A prediction (labels at the server: the logits go to the label party) with a
    hostile passive party: refused naming it, every party told ``stopped``, no logits
    reach anyone, no weight changes."""
    tamper, check = ATTACKS[attack]
    model, parties, _ = vertical_setup("server", join="concat")
    features, y = aligned_test_records()
    before = snapshot(parties)
    channel = RedisChannel(redis_url)

    def hostile(**kwargs):
        return evaluate_vertical_party(**{**kwargs, "channel": Tampering(channel, tamper)})

    run = run_evaluation(
        channel,
        model,
        parties,
        features,
        y,
        labels_at_server=True,
        party=hostile,
        hostile="h2",
        job=f"job-predict-attack-{abs(hash(attack)) % 10**6}",
        timeout=10.0,
        predict=True,
    )
    assert run.served is not None and not run.served.predicted
    assert "h2's eval_activations frame" in run.served.refused, run.served.refused
    assert f"{check!r} check" in run.served.refused or check in run.served.refused
    assert set(run.errors) == {"h1", "h2"} and not run.outcomes, "logits came out"
    assert all(isinstance(e, VerticalEvalFailed) for e in run.errors.values()), run.errors
    after = snapshot(parties)
    assert all(torch.equal(before[k], after[k]) for k in before), "a weight changed"


def test_a_forged_prediction_frame_for_another_position_is_dropped(redis_url: str) -> None:
    """A prediction frame for another position never enters the join: the label party's
    logits are the honest ones."""
    model, parties, _ = vertical_setup("server", join="concat")
    features, y = aligned_test_records()
    channel = RedisChannel(redis_url)

    def hostile(**kwargs):
        send_forged(channel, kwargs, position=0)
        return evaluate_vertical_party(**kwargs)

    run = run_evaluation(
        channel,
        model,
        parties,
        features,
        y,
        labels_at_server=True,
        party=hostile,
        hostile="h2",
        job="job-predict-stranger",
        timeout=10.0,
        predict=True,
    )
    assert not run.errors and run.served is not None and run.served.predicted
    assert run.served.counters["h2"].dropped == 1
    assert torch.equal(run.outcomes["h1"].logits, unsplit_logits(model, parties, features))
