"""An evaluation-only turn: a finished job's final model scored on one hospital's local
test set, through the split.

It is a turn with no training steps (``T = 0``) whose validation batches are the test
set's: ``eval_activations`` up and ``eval_outputs`` down for each test batch (the mode's
:meth:`~medsplit.modes.SplitMode.eval_activations`, ``eval_outputs`` and ``eval_logits``,
as every turn validates), then the hospital's ``metrics`` frame at step ``V``, answered
by ``done``. So it takes the handshake, the frame checks (invariant 5) and the resume
after a restart of either side from :class:`~medsplit.turns.TurnServer` and
:class:`~medsplit.turns.TurnClient` unchanged. What it adds is only what makes it learn
nothing: the server's role refuses every training frame (:class:`EvaluationOnlyRole`),
the server's state lives in memory and is never written back, and the hospital's
snapshots too; both sides run their segments in eval mode without gradients.

The wire carries an evaluation in a round no training turn uses
(:func:`evaluation_round`), so a stale frame of the job's training is dropped, and one
of an earlier evaluation too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LossFn, ServerRole
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import majority_baseline
from medsplit.training.schedule import turn_limits
from medsplit.training.tasks import SEGMENTATION, get_task
from medsplit.turns.checkpoints import MemoryCheckpointStore
from medsplit.turns.client import TurnClient
from medsplit.turns.control import TurnIds
from medsplit.turns.server import TurnHooks, TurnServer
from medsplit.turns.snapshots import MemorySnapshots
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind, FrameSpec

#: The metric the hospital adds to its metrics frame beside the validation leg's own:
#: the accuracy of always answering its training data's most common class.
BASELINE_METRIC = "val_baseline_accuracy"

#: What an evaluation reports, by the name the coordinator keeps it under, from the
#: metrics frame's names (the validation leg's). Losses are not reported: metrics only.
RESULT_NAMES: Mapping[str, str] = {
    "val_accuracy": "accuracy",
    "val_auc": "auc",
    BASELINE_METRIC: "baseline_accuracy",
    "val_dice": "dice",
    "val_samples": "samples",
}


def evaluation_round(rounds: int, attempt: int) -> int:
    """The round number an evaluation's frames carry: past the job's ``rounds`` (which no
    training turn uses), one per ``attempt`` (from 1)."""
    if attempt < 1:
        raise ValueError(f"an evaluation's attempt counts from 1, got {attempt}")
    return rounds + attempt - 1


def evaluation_limits(
    config: TrainingConfig,
    *,
    num_classes: int | None,
    test_samples: int,
    label_shape: tuple[int, ...] = (),
) -> FrameLimits:
    """What an evaluation's frames may hold: the job's batch and classes, no training
    step, and ``ceil(test_samples / batch_size)`` test batches."""
    return turn_limits(
        config, num_classes=num_classes, train=0, val=test_samples, label_shape=label_shape
    )


class EvaluationOnlyRole(ServerRole):
    """The server's step role of an evaluation: it trains nothing, so every training
    frame (activations, head gradients) is refused before anything runs on it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def handle(self, frame: Frame) -> Frame:
        raise FrameRejected.of(
            frame,
            checks.STEPS,
            f"a {frame.meta.kind} frame at step {frame.meta.step}: an evaluation trains "
            "nothing, it takes test batches (eval_activations) and the metrics only",
        )

    def expect(self) -> FrameSpec:
        return FrameSpec(kind=FrameKind.EVAL_ACTIVATIONS, tensors={})


def evaluation_server(
    *,
    ids: TurnIds,
    channel: Channel,
    streams: StreamPair,
    split: SplitModel,
    party: Party,
    final_state: bytes,
    hooks: TurnHooks,
    limits: FrameLimits,
    config: TrainingConfig,
    hospital: str | None = None,
    silence_timeout: float = 120.0,
    poll_interval: float = 1.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    reset_streams: bool = False,
) -> TurnServer:
    """The server's side of an evaluation: ``party`` (the server segment) starts from
    ``final_state`` (the job's result, :func:`~medsplit.protocol.handoff.export_parties`
    bytes) held in memory; nothing it does is written anywhere but ``hooks.finish``."""
    if limits.train_steps != 0:
        raise ValueError(f"an evaluation has no training steps; the limits say {limits}")
    mode = config.split_mode
    return TurnServer(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        party=party,
        store=MemoryCheckpointStore(final_state),
        hooks=hooks,
        limits=limits,
        hospital=hospital,
        checkpoint_every=max(1, limits.eval_steps or 1),
        silence_timeout=silence_timeout,
        poll_interval=poll_interval,
        loss_fn=config.loss_fn(),
        max_frame_bytes=max_frame_bytes,
        reset_streams=reset_streams,
        mode=mode,
        role=lambda: EvaluationOnlyRole(mode.name),
    )


def evaluation_client(
    *,
    ids: TurnIds,
    channel: Channel,
    streams: StreamPair,
    split: SplitModel,
    parties: Callable[[], dict[str, Party]],
    final_state: bytes,
    config: TrainingConfig,
    test: DataSplit,
    train_labels: torch.Tensor | None = None,
    num_classes: int | None = None,
    reply_timeout: float = 600.0,
    loss_fn: LossFn | None = None,
    device: str = "cpu",
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    stop: Any = None,
) -> TurnClient:
    """The hospital's side of an evaluation over its ``test`` set, its segments from
    ``final_state`` (the job's final weights as this hospital keeps them), snapshots in
    memory. A classification set adds the majority-class baseline: the accuracy on
    ``test`` of always answering ``train_labels``' most common class."""
    extra: dict[str, float] = {}
    if get_task(config.task).name != SEGMENTATION and train_labels is not None:
        extra[BASELINE_METRIC] = majority_baseline(train_labels, test.labels).accuracy
    empty = DataSplit(test.images[:0], test.labels[:0])
    return TurnClient(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        parties=parties,
        start=final_state,
        config=config,
        train=empty,
        val=test,
        snapshots=MemorySnapshots(),
        reply_timeout=reply_timeout,
        loss_fn=loss_fn,
        max_frame_bytes=max_frame_bytes,
        stop=stop,
        device=device,
        limits=evaluation_limits(
            config,
            num_classes=num_classes,
            test_samples=len(test),
            label_shape=tuple(test.labels.shape[1:]),
        ),
        extra_metrics=extra,
    )


def evaluation_results(metrics: Mapping[str, float]) -> dict[str, float]:
    """An evaluation's metrics frame under the names the coordinator keeps: accuracy,
    AUC and baseline (classification), mean Dice (segmentation), and the sample count;
    the rest (losses, pixel accuracy) is left out."""
    return {RESULT_NAMES[k]: float(v) for k, v in metrics.items() if k in RESULT_NAMES}
