"""A hostile party of a vertical job against the server's joint step.

The attacker is one party; its frames are encoded and decoded as on the wire. Each
refusal names what was wrong, and the server's top learns nothing from the step: its
weights and optimizer are as they were, and the honest parties' step can be taken next.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from medsplit.errors import FrameError, ProtocolError
from medsplit.models import build_model
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.roles import LABELS, StepIds
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.vertical_model import build_vertical, same_model_parts, vertical_parties
from medsplit.wire import Frame, FrameKind, decode_frame, encode_frame

BATCH = 8


def _setup() -> tuple[object, dict, TrainingConfig]:
    config = TrainingConfig(
        cuts=("pool1",),
        mode="vertical",
        mode_options={"join": "sum", "labels": "server"},
        batch_size=BATCH,
        server_optimizer=OptimizerConfig(name="adam", lr=0.01),
        job="job-7",
    )
    model = build_vertical(
        same_model_parts(
            build_model("small_cnn", seed=0), torch.zeros(2, 1, 28, 28), ("pool1",), ["a", "b"]
        ),
        mode=config.split_mode,  # type: ignore[arg-type]
        label_party="a",
    )
    parties = vertical_parties(model, config)
    server = config.split_mode.joint_server_role(  # type: ignore[attr-defined]
        parties["server"]["top"],
        inputs=model.inputs,
        top_input=model.top_input,
        head_boundary=None,
        label_party="a",
        job=config.job,
        limits=turn_limits(config, num_classes=2, train=10 * BATCH, val=0),
    )
    return server, parties, config


def _frame(step: int = 0, batch: int = BATCH, *, labels: bool, job: str = "job-7") -> Frame:
    ids = StepIds(job, 0, 0, step)
    tensors = {"pool1": torch.randn(batch, 16, 14, 14)}
    if labels:
        tensors[LABELS] = torch.randint(0, 2, (batch,))
    return Frame(ids.meta(FrameKind.ACTIVATIONS, "vertical", "none"), tensors)


def _wire(frame: Frame, server: object, party: str) -> Frame:
    return decode_frame(encode_frame(frame), expect=server.expect(party))  # type: ignore[attr-defined]


def _tamper_step(frames: dict[str, Frame]) -> None:
    frames["b"] = _frame(step=1, labels=False)


def _tamper_batch(frames: dict[str, Frame]) -> None:
    frames["b"] = _frame(batch=BATCH - 1, labels=False)


def _tamper_nan(frames: dict[str, Frame]) -> None:
    frames["b"].tensors["pool1"][0, 0, 0, 0] = float("nan")


def _tamper_labels(frames: dict[str, Frame]) -> None:
    frames["a"].tensors[LABELS][0] = 7


@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        (_tamper_step, "not on the same step"),
        (_tamper_batch, "batch"),
        (_tamper_nan, "finite"),
        (_tamper_labels, "labels"),
    ],
    ids=["another-step", "other-records", "nan-embedding", "labels-out-of-range"],
)
def test_a_hostile_party_is_refused_and_the_top_learns_nothing(
    tamper: Callable[[dict[str, Frame]], None], refusal: str
) -> None:
    server, parties, _ = _setup()
    top = parties["server"]["top"]
    before = copy.deepcopy(top.module.state_dict())
    frames = {"a": _frame(labels=True), "b": _frame(labels=False)}
    tamper(frames)
    with pytest.raises(FrameRejected, match=refusal):
        server.forward({p: _wire(f, server, p) for p, f in frames.items()})  # type: ignore[attr-defined]
    after = top.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not top.optimizer.state
    # The honest step goes through afterwards.
    honest = {"a": _frame(labels=True), "b": _frame(labels=False)}
    replies = server.forward({p: _wire(f, server, p) for p, f in honest.items()})  # type: ignore[attr-defined]
    assert set(replies) == {"a", "b"}
    assert set(replies["b"].tensors) == {"pool1"}  # its own gradient, nothing of the labels


def test_a_party_cannot_skip_the_others_or_speak_for_another_job() -> None:
    server, _, _ = _setup()
    with pytest.raises(ProtocolError, match="one frame from each of"):
        server.forward({"a": _frame(labels=True)})  # type: ignore[attr-defined]
    frames = {"a": _frame(labels=True), "b": _frame(labels=False, job="job-8")}
    with pytest.raises(ProtocolError, match="job 'job-8'"):
        server.forward(frames)  # type: ignore[attr-defined]
    # A passive party sending labels does not match its frame's form at all.
    with pytest.raises(FrameError, match=r"unexpected \[.labels.\]"):
        _wire(_frame(labels=True), server, "b")
