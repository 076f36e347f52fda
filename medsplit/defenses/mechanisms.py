"""The defenses' mechanisms, each a pure function of its inputs and a seeded generator.

Every draw comes from a ``torch.Generator`` seeded by :func:`defense_seed` from the
job's seed, the step's place in the job and the mechanism, never from global state: a
step done again (a resumed turn) draws the same noise, and two runs of a job give the
same weights.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import torch

__all__ = [
    "clip_and_noise",
    "defense_generator",
    "defense_seed",
    "gradient_noise",
    "per_sample_norms",
    "randomised_response",
]


def defense_seed(seed: int, round_: int, position: int, step: int, what: str) -> int:
    """A 63-bit seed for one mechanism (``what``) at one step of a job."""
    text = f"{seed}/{round_}/{position}/{step}/{what}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def defense_generator(
    seed: int, round_: int, position: int, step: int, what: str, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator on ``device`` seeded by :func:`defense_seed`."""
    generator = torch.Generator(device=device)
    generator.manual_seed(defense_seed(seed, round_, position, step, what))
    return generator


def per_sample_norms(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Each sample's L2 norm over all of ``tensors`` (batch first) taken as one vector."""
    squares = [t.reshape(t.shape[0], -1).pow(2).sum(1) for t in tensors.values()]
    return torch.stack(squares).sum(0).sqrt()


def clip_and_noise(
    tensors: Mapping[str, torch.Tensor],
    *,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """The Gaussian mechanism on every sample: scaled down to L2 norm ``clip_norm``
    at most (all ``tensors`` as one vector), then N(0, (σ·clip_norm)²) added to each
    value. Differentiable (the clipping's scale is part of the graph); tensors in name
    order draw their noise in that order."""
    norms = per_sample_norms(tensors)
    scale = (clip_norm / (norms + 1e-12)).clamp(max=1.0)
    out = {}
    for name in sorted(tensors):
        t = tensors[name]
        clipped = t * scale.reshape(-1, *([1] * (t.dim() - 1))).to(t.dtype)
        noise = torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)
        out[name] = clipped + noise * (noise_multiplier * clip_norm)
    return {name: out[name] for name in tensors}


def keep_probability(epsilon: float, classes: int) -> float:
    """Randomised response's chance of keeping a label: e^ε / (e^ε + K - 1)."""
    return math.exp(epsilon) / (math.exp(epsilon) + classes - 1)


def randomised_response(
    labels: torch.Tensor, *, classes: int, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """Each label kept with :func:`keep_probability`, otherwise one of the other
    ``classes - 1`` classes uniformly: ε-label-DP for each label (Warner's K-ary RR)."""
    keep = torch.rand(labels.shape, generator=generator) < keep_probability(epsilon, classes)
    # An offset in 1..K-1 gives every other class with the same chance.
    offset = torch.randint(1, max(classes, 2), labels.shape, generator=generator)
    flipped = (labels.cpu() + offset) % classes
    return torch.where(keep, labels.cpu(), flipped).to(labels.device, labels.dtype)


def gradient_noise(
    gradients: Mapping[str, torch.Tensor], *, scale: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Gaussian noise on gradients whose per-element std is ``scale · m / √d``, ``m``
    the batch's mean per-sample gradient norm and ``d`` the values per sample: the
    noise of one sample has a norm of about ``scale · m``, so it drowns the norm that
    the norm attack reads (after Li et al.'s Marvell)."""
    floats = {n: t for n, t in gradients.items() if t.is_floating_point()}
    if not floats:
        return dict(gradients)
    mean_norm = float(per_sample_norms(floats).mean())
    values = sum(t[0].numel() for t in floats.values())
    std = scale * mean_norm / math.sqrt(max(values, 1))
    out = dict(gradients)
    for name in sorted(floats):
        t = floats[name]
        noise = torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)
        out[name] = t + noise * std
    return out
