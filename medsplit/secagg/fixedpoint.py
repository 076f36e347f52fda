"""Fixed-point numbers in the ring Z/2^64, for weighted averages that masks can hide.

A float32 value ``w`` of hospital ``i`` with public integer weight ``n_i`` is encoded as

    e_i = n_i * round(w * 2^f)  (mod 2^64)

with ``f`` = :attr:`FixedPoint.scale_bits` (24 by default: a resolution of 2^-24 ≈ 6e-8),
``round`` to nearest with ties to even, and the result read as a two's-complement
integer. Ring elements are ``numpy.uint64`` arrays, whose addition wraps around modulo
2^64 by definition. The sum ``S = Σ e_i`` is taken in the ring (masks and all); once the
masks are gone its two's-complement value is the exact integer ``Σ n_i round(w_i 2^f)``,
as long as that fits in 63 bits, which :meth:`FixedPoint.encode` checks against the
round's total weight ``N = Σ n_i`` (each ``|round(w 2^f)| ≤ min((2^63 - 1) // N, 2^53)``,
so ``|w| < min(2^(63 - f) / N, 2^(53 - f))``: 2^39 / N and 2^29 at f = 24). Decoding
divides by ``N`` in integers, rounding to nearest (ties up), and scales by 2^-f in float64
(exact) before one rounding to float32.

Error bound against the exact weighted average ``a = Σ n_i w_i / N`` (real numbers):
each ``round`` is off by at most 1/2 of 2^-f, and so is their weighted mean; the integer
division adds at most 1/2 of 2^-f; the float32 rounding at most half an ulp, ``2^-24 |v|``
of the value ``v`` it rounds. So

    |decode - a| ≤ 2^-f + 2^-24 (|a| + 2^-f)       (:meth:`FixedPoint.error_bound`)

which ``tests/medsplit/test_secagg.py`` measures on random fronts (docs/protocol.md has
the figures). The same arithmetic in the clear (:func:`clear_weighted_sum`) gives, bit for
bit, what unmasking gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from medsplit.secagg.errors import FixedPointError

__all__ = ["DEFAULT_SCALE_BITS", "FixedPoint", "clear_weighted_sum"]

DEFAULT_SCALE_BITS = 24
_MAX_SIGNED = 2**63 - 1


@dataclass(frozen=True)
class FixedPoint:
    """The ring's scale: values are integers times 2^-``scale_bits``.

    Raises:
        FixedPointError: ``scale_bits`` is not an integer from 0 to 52 (beyond 52 a float64
            no longer scales back exactly).
    """

    scale_bits: int = DEFAULT_SCALE_BITS

    def __post_init__(self) -> None:
        bits = self.scale_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 52:
            raise FixedPointError(f"scale_bits must be an integer from 0 to 52, got {bits!r}")

    def limit(self, total_weight: int) -> int:
        """The largest ``|round(w 2^f)|`` a hospital may encode when the weights sum to
        ``total_weight``, so that the unmasked sum cannot wrap."""
        _check_weight("total_weight", total_weight)
        # Also at most 2**53, so that every average decodes exactly through float64.
        return min(_MAX_SIGNED // total_weight, 2**53)

    def quantize(self, values: torch.Tensor, total_weight: int) -> np.ndarray:
        """``round(values * 2^f)`` as a 1-D int64 array, checked against :meth:`limit`.

        Raises:
            FixedPointError: not a float32 tensor, a NaN or infinity, or too large.
        """
        if not isinstance(values, torch.Tensor) or values.dtype != torch.float32:
            got = values.dtype if isinstance(values, torch.Tensor) else type(values).__name__
            raise FixedPointError(f"expected a float32 tensor to encode, got {got}")
        wide = values.detach().cpu().reshape(-1).numpy().astype(np.float64)
        if not np.isfinite(wide).all():
            raise FixedPointError("cannot encode NaN or infinite values: the front diverged")
        # Scaling by a power of two is exact in float64; rint rounds ties to even.
        scaled = np.rint(np.multiply(wide, float(2**self.scale_bits), out=wide), out=wide)
        limit = self.limit(total_weight)
        largest = float(np.abs(scaled).max()) if scaled.size else 0.0
        if largest > limit:
            raise FixedPointError(
                f"a value of magnitude {largest / 2**self.scale_bits:.6g} does not fit the "
                f"ring at scale 2^-{self.scale_bits} with total weight {total_weight} "
                f"(at most {limit / 2**self.scale_bits:.6g}): lower scale_bits"
            )
        return scaled.astype(np.int64)

    def encode(self, values: torch.Tensor, weight: int, total_weight: int) -> np.ndarray:
        """``weight * round(values * 2^f)`` in the ring: a 1-D ``uint64`` array.

        Raises:
            FixedPointError: as :meth:`quantize`; or ``weight`` is not a positive integer
                at most ``total_weight``.
        """
        _check_weight("weight", weight)
        if weight > total_weight:
            raise FixedPointError(f"weight {weight} exceeds the total weight {total_weight}")
        quantized = self.quantize(values, total_weight)
        # |quantized| * weight <= limit * total_weight < 2**63: no int64 overflow here.
        quantized *= np.int64(weight)
        return quantized.view(np.uint64)

    def decode(self, ring_sum: np.ndarray, total_weight: int) -> torch.Tensor:
        """The float32 weighted average from the unmasked ring sum (1-D ``uint64``).

        Raises:
            FixedPointError: not a 1-D ``uint64`` array.
        """
        if not isinstance(ring_sum, np.ndarray) or ring_sum.dtype != np.uint64:
            raise FixedPointError("expected the ring sum as a numpy uint64 array")
        _check_weight("total_weight", total_weight)
        quotient, remainder = np.divmod(ring_sum.view(np.int64), np.int64(total_weight))
        # divmod floors, so 0 <= remainder < N. Round to nearest, ties up: 2r >= N,
        # written so that 2r cannot overflow.
        quotient += remainder >= np.int64(total_weight) - remainder
        # |quotient| <= limit <= 2**53: exact in float64, and so is the scaling.
        scaled = quotient.astype(np.float64) * 2.0**-self.scale_bits
        return torch.from_numpy(scaled.astype(np.float32))

    def error_bound(self, average: torch.Tensor) -> torch.Tensor:
        """The bound on ``|decode - a|`` for the exact average ``a`` (see the module)."""
        resolution = 2.0**-self.scale_bits
        return resolution + 2.0**-24 * (average.abs().to(torch.float64) + resolution)


def clear_weighted_sum(
    vectors: Sequence[torch.Tensor], weights: Sequence[int], fixed: FixedPoint
) -> np.ndarray:
    """``Σ weight_i round(vector_i 2^f)`` in the ring, in the clear: the reference that
    unmasking must equal bit for bit."""
    if len(vectors) != len(weights) or not vectors:
        raise FixedPointError("expected one weight per vector, and at least one vector")
    total = sum(weights)
    acc = np.zeros(vectors[0].numel(), dtype=np.uint64)
    for vector, weight in zip(vectors, weights, strict=True):
        acc += fixed.encode(vector, weight, total)
    return acc


def _check_weight(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_SIGNED:
        raise FixedPointError(f"{what} must be a positive integer below 2**63, got {value!r}")
