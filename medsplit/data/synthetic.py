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
    _check_args(n, shape, num_classes, seed, least_side=4)

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


def synthetic_segmentation_split(
    n: int,
    *,
    shape: tuple[int, ...] = (1, 64, 64),
    num_classes: int = 2,
    seed: int = 0,
    num_objects: int = 4,
    noise: float = 0.25,
) -> DataSplit:
    """Make ``n`` noisy images of discs (balls in volumes) and their masks, with MONAI's
    generator (``monai.data.synthetic.create_test_image_2d`` / ``_3d``).

    Each image holds ``num_objects`` discs of radius from a twelfth to a quarter of its
    smallest side over uniform noise of up to ``noise``; with two classes a disc is
    foreground (class 1) and shows at a random brightness in [0.5, 1], with more each
    disc gets a class from 1 to ``num_classes - 1`` and the brightness of its class.
    Every channel holds the same image.

    Args:
        n: number of images.
        shape: ``(C, H, W)`` or ``(C, D, H, W)``; spatial sizes >= 12.
        num_classes: classes of the masks, background (0) included, at least 2.
        seed: the same seed gives the same images and masks; the global RNGs are unused.
        num_objects: discs per image (they may overlap).
        noise: the most noise added, in [0, 1) (relative to the brightest class).

    Returns:
        A :class:`DataSplit` with float32 images in [0, 1] and int64 masks ``(N, 1, *spatial)``.

    Raises:
        ConfigError: an argument is out of range (the message names it).
    """
    import numpy as np
    from monai.data.synthetic import create_test_image_2d, create_test_image_3d

    _check_args(n, shape, num_classes, seed, least_side=12)
    if not _is_int(num_objects) or num_objects < 1:
        raise ConfigError(f"num_objects must be an integer >= 1, got {num_objects!r}")
    if not isinstance(noise, int | float) or not 0 <= noise < 1:
        raise ConfigError(f"noise must be a number in [0, 1), got {noise!r}")
    channels, spatial = shape[0], shape[1:]
    side = min(spatial)
    rad_max = (side - 1) // 4  # MONAI needs the side above 2 * rad_max
    rad_min = max(1, side // 12)
    state = np.random.RandomState(seed)
    images, masks = [], []
    for _ in range(n):
        args = dict(
            num_objs=num_objects,
            rad_max=rad_max,
            rad_min=rad_min,
            noise_max=float(noise),
            num_seg_classes=num_classes - 1,
            random_state=state,
        )
        if len(spatial) == 2:
            image, mask = create_test_image_2d(*spatial, **args)
        else:
            # MONAI's 3D generator takes (height, width, depth); ours is (D, H, W).
            depth, height, width = spatial
            image, mask = create_test_image_3d(height, width, depth, **args)
            image, mask = image.transpose(2, 0, 1), mask.transpose(2, 0, 1)
        images.append(torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)))
        masks.append(torch.from_numpy(np.ascontiguousarray(mask).astype(np.int64)))
    stacked = torch.stack(images).unsqueeze(1).expand(n, channels, *spatial).contiguous()
    return DataSplit(images=stacked.clamp_(0.0, 1.0), labels=torch.stack(masks).unsqueeze(1))


def _check_args(
    n: object, shape: object, num_classes: object, seed: object, *, least_side: int
) -> None:
    """The arguments both generators share, each named when it is out of range."""
    if not _is_int(n) or n < 1:
        raise ConfigError(f"n must be an integer >= 1, got {n!r}")
    if (
        not isinstance(shape, tuple)
        or len(shape) not in (3, 4)
        or not all(_is_int(s) for s in shape)
        or shape[0] < 1
        or min(shape[1:]) < least_side
    ):
        raise ConfigError(
            "shape must be (C, H, W) or (C, D, H, W) with C >= 1 and spatial sizes >= "
            f"{least_side}, got {shape!r}"
        )
    if not _is_int(num_classes) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
