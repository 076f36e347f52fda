"""Synthetic labelled images for demos and for tests that must run without real data."""

from __future__ import annotations

import math

import torch

from medsplit.data.shards import DataSplit
from medsplit.errors import ConfigError

_BACKGROUND = 0.25
_STRIPE_AMPLITUDE = 0.5
_STRIPE_PERIOD = 6.0  # pixels: fine enough for 3x3 kernels to see the orientation
_PHASE_JITTER = 0.25  # of a period, either way
_NOISE_STD = 0.1


def synthetic_split(
    n: int, *, shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 2, seed: int = 0
) -> DataSplit:
    """Make ``n`` noisy images whose class shows as the orientation of a stripe pattern.

    Class ``k`` draws cosine stripes at angle ``pi*k/num_classes`` with a period of six
    pixels and a phase jittered by up to a quarter period per image, over a grey
    background plus Gaussian noise. Orientation is a local texture, so networks that end
    in global pooling (all registry models) learn it in a few dozen steps, and the
    per-class mean image also separates the classes. In volumes the stripes lie in the
    last two axes and are constant along depth.

    Args:
        n: number of images.
        shape: ``(C, H, W)`` or ``(C, D, H, W)`` of one image; spatial sizes >= 4.
        num_classes: number of classes; labels are balanced (counts differ by at most 1)
            and shuffled.
        seed: the same seed gives the same images and labels; the global RNG is unused.

    Returns:
        A :class:`DataSplit` with float32 images in [0, 1] and int64 labels.

    Raises:
        ConfigError: an argument is out of range (the message names it).
    """
    if not _is_int(n) or n < 1:
        raise ConfigError(f"n must be an integer >= 1, got {n!r}")
    if (
        not isinstance(shape, tuple)
        or len(shape) not in (3, 4)
        or not all(_is_int(s) for s in shape)
        or shape[0] < 1
        or min(shape[1:]) < 4
    ):
        raise ConfigError(
            "shape must be (C, H, W) or (C, D, H, W) with C >= 1 and spatial sizes >= 4, "
            f"got {shape!r}"
        )
    if not _is_int(num_classes) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")

    generator = torch.Generator().manual_seed(seed)
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=generator)]
    phase = (torch.rand(n, generator=generator) * 2 - 1) * (_PHASE_JITTER * 2 * math.pi)

    channels, spatial = shape[0], shape[1:]
    rows, cols = torch.meshgrid(
        torch.arange(spatial[-2], dtype=torch.float32),
        torch.arange(spatial[-1], dtype=torch.float32),
        indexing="ij",
    )
    angle = (labels.to(torch.float32) * (math.pi / num_classes)).view(n, 1, 1)
    # Distance along the stripes' normal, per image: (n, H, W).
    along = cols * torch.cos(angle) + rows * torch.sin(angle)
    wave = torch.cos(along * (2 * math.pi / _STRIPE_PERIOD) + phase.view(n, 1, 1))
    plane = _BACKGROUND + _STRIPE_AMPLITUDE * 0.5 * (1 + wave)

    # Broadcast the plane over channels (and depth for volumes), then add fresh noise.
    leading = [1] * (len(spatial) - 2)
    images = plane.view(n, 1, *leading, spatial[-2], spatial[-1]).expand(n, channels, *spatial)
    noise = torch.randn(n, channels, *spatial, generator=generator) * _NOISE_STD
    images = (images + noise).clamp_(0.0, 1.0)
    return DataSplit(images=images, labels=labels)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
