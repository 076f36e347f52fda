"""Split inference: a finished job's final model predicting on new images, through the
split, on the evaluation turn's three legs.

The hospital runs its front on a batch (the mode's
:meth:`~medsplit.modes.SplitMode.eval_activations`), applies the job's activation noise
as its training did (:func:`inference_activations`), and sends an ``eval_activations``
frame up; the server segment answers it forward only (``eval_outputs``: checked first,
the batch no larger than the serving batch size, computed in eval mode without
gradients, checked again); the hospital turns the answer into logits
(``eval_logits``: vanilla's and SplitFed's server sends them, U-shaped's sends the
middle's outputs and the head stays at home). Nothing trains: no optimizer steps, no
state is written, and a frame that fails a check ends the request with a ``stopped``
frame down (and its reason on the server's side).

There is no handshake: one request is one pass over its batches, in order, in a round
of its own (:func:`inference_round`), so a frame of another request, an evaluation or the
job's training is dropped. A request that fails is asked again, as a new request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import SplitModel
from medsplit.defenses.mechanisms import clip_and_noise, defense_generator
from medsplit.defenses.options import PrivacyOptions
from medsplit.errors import MedSplitError
from medsplit.modes import SplitMode
from medsplit.protocol import checks
from medsplit.protocol.checks import FrameLimits, FrameRejected
from medsplit.protocol.party import Party
from medsplit.turns import control
from medsplit.turns.control import TurnIds
from medsplit.turns.frameio import FrameCounters, FrameIO
from medsplit.wire import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind

__all__ = [
    "INFERENCE_ROUND_BASE",
    "INFERENCE_TOPIC",
    "InferenceFailed",
    "InferenceResult",
    "InferenceServed",
    "inference_activations",
    "inference_limits",
    "inference_round",
    "predict_through",
    "serve_inference",
]

#: The stream pair's topic an inference request's frames go on (``RelayKeys.streams``),
#: apart from the job's training streams.
INFERENCE_TOPIC = "infer"

#: Inference rounds start here, far past any job's training rounds and evaluations
#: (``rounds + attempt - 1``), so no frame of those is taken for an inference's.
INFERENCE_ROUND_BASE = 1 << 40


class InferenceFailed(MedSplitError):
    """An inference request ended without its predictions (the other side stopped it, or
    went silent)."""


def inference_round(request: int) -> int:
    """The round an inference request's frames carry: one per request id (from 1)."""
    if request < 1:
        raise ValueError(f"an inference request's id counts from 1, got {request}")
    return INFERENCE_ROUND_BASE + request


def inference_limits(
    *,
    serving_batch: int,
    samples: int,
    num_classes: int | None,
    label_shape: tuple[int, ...] = (),
) -> FrameLimits:
    """What a request's frames may hold: no training step, ``samples`` in batches of
    ``serving_batch`` (the last one shorter), the job's classes and mask shape."""
    if serving_batch < 1 or samples < 1:
        raise ValueError(f"serving batch and samples must be >= 1: {serving_batch}, {samples}")
    return FrameLimits(
        batch_size=serving_batch,
        exact_batch=False,
        num_classes=num_classes,
        train_steps=0,
        val_samples=samples,
        label_shape=label_shape,
    )


def inference_activations(
    mode: SplitMode,
    parties: Mapping[str, Party],
    x: torch.Tensor,
    *,
    privacy: PrivacyOptions,
    noise_multiplier: float | None,
    seed: int,
    ids: TurnIds,
    batch: int,
) -> dict[str, torch.Tensor]:
    """The front's outputs for ``x`` as they cross: the mode's ``eval_activations``, then
    the job's activation noise (clipping and the Gaussian mechanism at the training's
    ``noise_multiplier``, drawn from a generator seeded by the job, the request and the
    batch) when the job trained with it. NoPeek and label or gradient noise act on
    training only: nothing of them crosses at inference."""
    out = mode.eval_activations(parties, x)
    noise = privacy.activation_noise
    if noise is None:
        return out
    if noise_multiplier is None:
        raise ValueError("the job's activation noise needs its noise multiplier")
    floats = {n: t for n, t in out.items() if t.is_floating_point()}
    device = next(iter(floats.values())).device if floats else "cpu"
    generator = defense_generator(seed, ids.round, ids.position, batch, "inference", device)
    out.update(
        clip_and_noise(
            floats,
            clip_norm=noise.clip_norm,
            noise_multiplier=noise_multiplier,
            generator=generator,
        )
    )
    return out


@dataclass
class InferenceServed:
    """What the server did for one request: batches and samples answered, the frames'
    counts and sizes (never values), and the check that stopped it, if one did."""

    batches: int = 0
    samples: int = 0
    counters: FrameCounters | None = None
    refused: str = ""


def serve_inference(
    *,
    channel: Channel,
    streams: StreamPair,
    ids: TurnIds,
    mode: SplitMode,
    split: SplitModel,
    party: Party,
    limits: FrameLimits,
    silence_timeout: float = 60.0,
    poll: float = 1.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    interrupted: Callable[[], bool] = lambda: False,
) -> InferenceServed:
    """Answer one request's ``limits.eval_steps`` batches, in order, with ``party`` (the
    job's final server segment, already loaded: it is only read). A frame that fails a
    check (another kind, a batch out of order, a shape, a dtype, a batch larger than the
    serving batch, non-finite values) is answered ``stopped`` and ends the request.

    Raises:
        InferenceFailed: the hospital went silent for ``silence_timeout`` seconds.
    """
    io = FrameIO(
        channel,
        inbound=streams.up,
        outbound=streams.down,
        ids=ids,
        max_frame_bytes=max_frame_bytes,
        where=f"inference {ids.job} round {ids.round}",
    )
    served = InferenceServed(counters=io.counters)
    assert limits.eval_steps is not None
    for index in range(limits.eval_steps):
        try:
            frame = io.next_frame(
                silence_timeout=silence_timeout,
                poll=poll,
                interrupted=interrupted,
                silent=lambda waited, err, at=index: InferenceFailed(
                    f"the hospital sent nothing for {waited:.0f} s at batch {at}{err}"
                ),
            )
            if frame is None:
                served.refused = "interrupted"
                return served
            _check_order(frame, index)
            outputs = mode.eval_outputs(frame, party=party, split=split, limits=limits)
        except FrameRejected as e:
            served.refused = str(e)
            io.send(control.signal(ids, FrameKind.STOPPED, index))
            return served
        io.send(ids.frame(FrameKind.EVAL_OUTPUTS, index, outputs))
        served.batches += 1
        served.samples += checks.batch_of(frame)
    return served


def _check_order(frame: Frame, index: int) -> None:
    if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS:
        raise FrameRejected.of(
            frame,
            checks.STEPS,
            f"a {frame.meta.kind} frame in an inference, which takes eval_activations only",
        )
    if frame.meta.step != index:
        raise FrameRejected.of(
            frame, checks.STEPS, f"batch {frame.meta.step} came where batch {index} was due"
        )


@dataclass
class InferenceResult:
    """A request's logits (all batches, in order) and its frames' counts and sizes."""

    logits: torch.Tensor
    counters: FrameCounters


def predict_through(
    *,
    channel: Channel,
    streams: StreamPair,
    ids: TurnIds,
    mode: SplitMode,
    split: SplitModel,
    parties: Mapping[str, Party],
    images: torch.Tensor,
    limits: FrameLimits,
    privacy: PrivacyOptions,
    noise_multiplier: float | None = None,
    seed: int = 0,
    reply_timeout: float = 120.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    device: torch.device | str = "cpu",
) -> InferenceResult:
    """The hospital's side of one request: ``images`` in the serving batches ``limits``
    gives, each one's activations up and its logits back (checked by the mode's
    ``eval_logits`` before the head runs on them). One batch is in flight at a time.

    Raises:
        InferenceFailed: the server stopped the request, or did not answer in time.
        FrameRejected: the server's answer failed a check; nothing of it was used.
    """
    if limits.val_samples != len(images):
        raise ValueError(f"the limits are for {limits.val_samples} images, got {len(images)}")
    io = FrameIO(
        channel,
        inbound=streams.down,
        outbound=streams.up,
        ids=ids,
        max_frame_bytes=max_frame_bytes,
        where=f"inference {ids.job} round {ids.round}",
    )
    out: list[torch.Tensor] = []
    assert limits.eval_steps is not None
    for index in range(limits.eval_steps):
        x = images[index * limits.batch_size : (index + 1) * limits.batch_size].to(device)
        tensors = inference_activations(
            mode,
            parties,
            x,
            privacy=privacy,
            noise_multiplier=noise_multiplier,
            seed=seed,
            ids=ids,
            batch=index,
        )
        io.send(ids.frame(FrameKind.EVAL_ACTIVATIONS, index, tensors))
        frame = io.answer(
            FrameKind.EVAL_OUTPUTS, index, timeout=reply_timeout, failed=InferenceFailed
        )
        out.append(
            mode.eval_logits(
                frame,
                parties=parties,
                split=split,
                samples=len(x),
                limits=limits,
                device=device,
            ).cpu()
        )
    return InferenceResult(torch.cat(out), io.counters)
