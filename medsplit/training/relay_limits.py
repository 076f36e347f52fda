"""How much a job may put on the relay: the bounds the workers hold every hospital to.

A Redis ACL cannot limit a command's arguments, so a hospital may ``XADD`` as much as it
likes to its own streams and ``SET`` blobs as large as it likes for others. What an honest
hospital stores is known from the job, though: one frame in flight on each of its streams
(a re-sent step or a hello at most doubles that, and the frame its reader took last stays
until that reader's next read), and one sealed hand-off per other
participant. These bounds are computed here from the job's split, with slack, and the
workers hold every hospital to them (``workers/relay_guard.py``): the reader refuses an
oversized frame from its first chunk, and a hospital whose keys hold more than their
bound has its turn failed and its relay user suspended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from medsplit.cutting import SplitModel
from medsplit.defenses.accounting import largest_poisson_batch
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig

#: Room for a frame's safetensors header, control tensors and rounding.
FRAME_OVERHEAD = 64 * 1024
#: Room for a sealed blob's header, signature, and the optimizer's scalar state.
BLOB_OVERHEAD = 64 * 1024
#: Frames an honest hospital may leave on one stream at once (a frame and a re-send).
FRAMES_IN_FLIGHT = 2
#: ... and the frame its reader took last, which the reader deletes with its next read
#: (``medsplit.channel.redis``).
FRAMES_TAKEN = 1
#: What a stream's consumer group costs in Redis (the group, its reader, its pending list).
GROUP_OVERHEAD = 2 * 1024
#: What Redis spends per stream entry beyond its payload, and per small key.
ENTRY_OVERHEAD = 256
KEY_OVERHEAD = 4 * 1024
SLACK = 1.25


@dataclass(frozen=True)
class RelayLimits:
    """The most one hospital's keys may hold in one job.

    Attributes:
        frame_bytes: the largest frame of the job (its encoded size with codec ``none``).
        stream_bytes: what one of its streams may hold at once (its memory in Redis).
        blob_bytes: the largest sealed blob it may leave for another participant.
        counter_bytes: what one stream's counter hash may hold.
    """

    frame_bytes: int
    stream_bytes: int
    blob_bytes: int
    counter_bytes: int = KEY_OVERHEAD
    #: What one of its secure-aggregation streams (``agg``) may hold: a masked vector of
    #: its segments (8 bytes a value) and a re-send, or the aggregate; 0 in other modes.
    aggregation_stream_bytes: int = 0

    def max_chunks(self, chunk_bytes: int) -> int:
        """How many chunks of ``chunk_bytes`` the largest frame takes."""
        return max(1, -(-self.frame_bytes // chunk_bytes))


def relay_limits(
    split: SplitModel,
    config: TrainingConfig,
    *,
    label_shape: tuple[int, ...] = (),
    fronts: Sequence[SplitModel] = (),
) -> RelayLimits:
    """The bounds of ``config``'s job cut as ``split`` (see the module docstring);
    ``label_shape``: one sample's target, ``()`` a class index, ``(1, *spatial)`` a
    segmentation job's mask (``JobDescription.label_shape``), whose logits are per pixel;
    ``fronts``: a vertical job's parties' own models, cut at their fronts, whose
    embeddings cross too."""
    batch = config.batch_size
    if config.privacy.activation_noise is not None:
        batch = largest_poisson_batch(batch)  # Poisson sampling's batches vary
    per_sample = max(
        sum(t.numel * t.dtype.itemsize for t in boundary)
        for boundary in [*split.boundaries, *(front.boundaries[0] for front in fronts)]
    )
    # Labels (int64, where they cross) and the logits of validation (at most the classes
    # of a float64 output, per pixel of a mask) are counted: a class index is smaller than
    # any cut in the registry, but a mask is not.
    pixels = math.prod(label_shape[1:])
    labels = 8 * math.prod(label_shape)
    frame = int(SLACK * batch * (per_sample + labels + 8 * _outputs(split) * pixels))
    frame += FRAME_OVERHEAD
    held = FRAMES_IN_FLIGHT + FRAMES_TAKEN
    stream = held * (frame + ENTRY_OVERHEAD) + KEY_OVERHEAD + GROUP_OVERHEAD
    # The hospital hands on every segment it holds in the job's mode.
    mine = [split.segments[i] for i in config.split_mode.client_segments().values()]
    state = sum(_state_bytes(segment, config.client_optimizer) for segment in mine)
    blob = int(SLACK * state) + BLOB_OVERHEAD
    aggregation = 0
    if config.split_mode.secure_aggregation:
        values = sum(
            p.numel()
            for segment in mine
            for p in segment.state_dict().values()
            if p.is_floating_point()
        )
        submission = int(SLACK * 8 * values) + FRAME_OVERHEAD
        aggregation = held * (submission + ENTRY_OVERHEAD) + KEY_OVERHEAD + GROUP_OVERHEAD
    return RelayLimits(
        frame_bytes=frame,
        stream_bytes=stream,
        blob_bytes=blob,
        aggregation_stream_bytes=aggregation,
    )


def _outputs(split: SplitModel) -> int:
    """Values per sample of the model's output (validation's logits), at most 1024."""
    last = split.segments[-1]
    params = list(last.parameters())
    return min(1024, int(params[-1].numel()) if params else 1024)


def _state_bytes(segment: torch.nn.Module, optimizer: OptimizerConfig) -> int:
    """A segment's training state in a hand-off: weights, buffers and optimizer slots."""
    params = sum(p.numel() * p.element_size() for p in segment.parameters())
    buffers = sum(b.numel() * b.element_size() for b in segment.buffers())
    slots = {"adam": 2, "adamw": 2}.get(optimizer.name, 1 if optimizer.momentum else 0)
    steps = 8 * sum(1 for _ in segment.parameters()) * (slots > 0)
    return params * (1 + slots) + buffers + steps
