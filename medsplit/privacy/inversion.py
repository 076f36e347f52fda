"""Model inversion: how well the activations at a cut give back the images.

An attacker who sees what crosses the cut, and has images like the hospital's, trains an
inverse network from activations to images (He, Zhang and Lee, "Model inversion attacks
against collaborative inference", ACSAC 2019: SSIM 0.99 from the first convolution on
MNIST; below about 0.3 a reconstruction is taken as unrecognisable). Here the hospital
plays that attacker against its own front, at its best: it trains the decoder on pairs
(x, front(x)) from its training split and reconstructs its validation split from the
activations alone. Quality is MONAI's SSIM and PSNR with images in [0, 1].
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from monai.metrics import PSNRMetric, SSIMMetric
from monai.networks.layers.factories import Conv
from PIL import Image
from torch import nn

from medsplit.errors import ConfigError, DataError

__all__ = [
    "InversionDecoder",
    "InversionSettings",
    "image_quality",
    "reconstruct",
    "save_picture_grid",
    "train_decoder",
]


@dataclass(frozen=True)
class InversionSettings:
    """How the inverse network is trained.

    Attributes:
        steps: Adam steps on the training pairs (mean squared error).
        batch_size: pairs per step, drawn without replacement, reshuffled each pass.
        lr: Adam's learning rate.
        width: channels of the decoder's convolutions.
        seed: seeds the decoder's initial weights and the batch order.
    """

    steps: int = 300
    batch_size: int = 64
    lr: float = 2e-3
    width: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"inversion {name} must be an integer >= 1, got {value!r}")
        if not self.lr > 0:
            raise ConfigError(f"inversion lr must be > 0, got {self.lr!r}")


class InversionDecoder(nn.Module):
    """A decoder from one activation to one image, sized from both shapes.

    An activation with the image's number of spatial axes (a feature map) enters a
    convolution as it is; any other (a vector after pooling, flattening or a linear
    layer) goes through a linear layer to a feature map of a quarter of the image's size.
    Then 2x nearest upsampling and a convolution until the map is as large as the image,
    a resize to its exact size, two convolutions and a sigmoid (images are in [0, 1]).
    Works for any cut that one tensor crosses, in 2-D or 3-D.
    """

    def __init__(
        self, activation_shape: Sequence[int], image_shape: Sequence[int], *, width: int = 32
    ):
        super().__init__()
        image_shape, activation_shape = tuple(image_shape), tuple(activation_shape)
        spatial = image_shape[1:]
        dims = len(spatial)
        conv = Conv[Conv.CONV, dims]
        layers: list[nn.Module] = []
        if len(activation_shape) == dims + 1:
            current = activation_shape[1:]
            layers += [conv(activation_shape[0], width, 3, padding=1), nn.ReLU()]
        else:
            current = tuple(max(1, math.ceil(s / 4)) for s in spatial)
            features = math.prod(activation_shape)
            layers += [
                nn.Flatten(),
                nn.Linear(features, width * math.prod(current)),
                nn.Unflatten(1, (width, *current)),
                nn.ReLU(),
            ]
        while any(c < s for c, s in zip(current, spatial, strict=True)):
            current = tuple(2 * c for c in current)
            layers += [
                nn.Upsample(scale_factor=2, mode="nearest"),
                conv(width, width, 3, padding=1),
            ]
            layers.append(nn.ReLU())
        if current != spatial:
            layers.append(nn.Upsample(size=spatial, mode="nearest"))
        layers += [
            conv(width, width, 3, padding=1),
            nn.ReLU(),
            conv(width, image_shape[0], 3, padding=1),
        ]
        layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        return self.net(activation)


def train_decoder(
    activations: torch.Tensor, images: torch.Tensor, settings: InversionSettings
) -> InversionDecoder:
    """Train an :class:`InversionDecoder` on (activation, image) pairs; seeded, and the
    global random stream is left as it was."""
    _check_images(images)
    if len(activations) != len(images):
        raise ConfigError(f"{len(activations)} activations but {len(images)} images")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        decoder = InversionDecoder(activations.shape[1:], images.shape[1:], width=settings.width)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=settings.lr)
    generator = torch.Generator().manual_seed(settings.seed)
    batch = min(settings.batch_size, len(images))
    order = torch.empty(0, dtype=torch.long)
    decoder.train()
    for _ in range(settings.steps):
        if len(order) < batch:
            order = torch.randperm(len(images), generator=generator)
        chosen, order = order[:batch], order[batch:]
        loss = nn.functional.mse_loss(decoder(activations[chosen]), images[chosen])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    decoder.eval()
    return decoder


def reconstruct(
    decoder: InversionDecoder, activations: torch.Tensor, *, batch_size: int = 256
) -> torch.Tensor:
    """The decoder's images for ``activations`` (no gradients)."""
    with torch.no_grad():
        return torch.cat(
            [
                decoder(activations[i : i + batch_size])
                for i in range(0, len(activations), batch_size)
            ]
        )


def image_quality(originals: torch.Tensor, reconstructions: torch.Tensor) -> tuple[float, float]:
    """Mean SSIM and mean PSNR (dB) of ``reconstructions`` against ``originals``, both in
    [0, 1] (MONAI's ``SSIMMetric`` and ``PSNRMetric``, data range 1). The SSIM window is
    MONAI's 11 or, on smaller images, the largest odd size that fits."""
    _check_images(originals)
    dims = originals.dim() - 2
    window = min(11, *originals.shape[2:])
    window -= 1 - window % 2
    ssim = SSIMMetric(spatial_dims=dims, data_range=1.0, win_size=window)
    psnr = PSNRMetric(max_val=1.0)
    a, b = originals.float(), reconstructions.float()
    return float(ssim(b, a).mean()), float(psnr(b, a).mean())


def _check_images(images: torch.Tensor) -> None:
    if images.dim() < 4:
        raise DataError(f"images must be (N, C, H, W) or (N, C, D, H, W), got {list(images.shape)}")
    if images.numel() and (images.min() < 0 or images.max() > 1):
        raise DataError(
            "the privacy audit measures images in [0, 1] (SSIM and PSNR with data range 1); "
            f"these span [{float(images.min()):.3g}, {float(images.max()):.3g}]"
        )


def save_picture_grid(
    originals: torch.Tensor,
    reconstructions: torch.Tensor,
    path: str | os.PathLike[str],
    *,
    columns: int = 8,
    scale: int = 4,
) -> Path:
    """A PNG (Pillow) of the first ``columns`` originals, each above its reconstruction:
    the first channel, the middle slice of a volume, each pixel ``scale`` times larger.
    The file is the caller's to keep where it belongs (the hospital's work directory)."""
    count = min(columns, len(originals))
    if count < 1:
        raise ConfigError("no images to draw")

    def plane(image: torch.Tensor) -> np.ndarray:
        image = image[0]
        while image.dim() > 2:
            image = image[image.shape[0] // 2]
        return image.clamp(0, 1).mul(255).round().to(torch.uint8).numpy()

    rows = [
        np.concatenate([plane(images[i]) for i in range(count)], axis=1)
        for images in (originals, reconstructions)
    ]
    grid = np.concatenate(rows, axis=0)
    grid = np.kron(grid, np.ones((scale, scale), dtype=np.uint8))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(out, format="PNG")
    return out
