"""Codecs: how one tensor is stored on the wire, and how much each one may change it.

A codec turns a tensor into named *parts* (tensors that safetensors can store) and back.
The part called ``"data"`` is stored under the caller's tensor name; any other part (for
example the int8 scale) is stored under a key built by :func:`part_key`, which starts with
:data:`RESERVED_PREFIX` so it can never collide with a caller's name.

Codecs change floating tensors only. Integer and bool tensors (labels) always cross with
``none``, bit for bit, and so does any tensor a codec does not apply to.

Every codec states its error bound in its docstring and computes it with
:meth:`Codec.error_bound`, so tests check the bound that is documented.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import torch

from medsplit.errors import CodecError, FrameError

__all__ = [
    "CODECS",
    "DATA_PART",
    "RESERVED_PREFIX",
    "Bf16Codec",
    "Codec",
    "Fp16Codec",
    "Int8Codec",
    "NoneCodec",
    "describe_codecs",
    "get_codec",
    "part_key",
]

#: Caller tensor names may not start with this: it is kept for codec parts and for
#: safetensors' own ``__metadata__`` entry.
RESERVED_PREFIX = "__"

#: The part stored under the caller's own tensor name.
DATA_PART = "data"

FLOATING_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float64, torch.float32, torch.float16, torch.bfloat16}
)

# Unit roundoff (half an ulp relative to |x|) and half the smallest subnormal spacing
# of each floating dtype: one rounding into that dtype moves x by at most
# max(u * |x|, tiny).
_UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}
_HALF_SUBNORMAL: dict[torch.dtype, float] = {
    torch.float64: 0.0,  # 2**-1075 underflows to 0 and float64 needs no extra rounding
    torch.float32: 2.0**-150,
    torch.float16: 2.0**-25,
    torch.bfloat16: 2.0**-134,
}


def part_key(name: str, part: str) -> str:
    """The safetensors key under which ``part`` of tensor ``name`` is stored.

    Args:
        name: the caller's tensor name (never starting with :data:`RESERVED_PREFIX`).
        part: a codec part name (letters only).

    Returns:
        ``name`` itself for :data:`DATA_PART`, else ``"__<part>/<name>"``.
    """
    if part == DATA_PART:
        return name
    return f"{RESERVED_PREFIX}{part}/{name}"


class Codec(ABC):
    """One way of storing a tensor on the wire.

    Subclasses set :attr:`name` and :attr:`parts` and implement :meth:`applies_to`,
    :meth:`encode`, :meth:`decode` and :meth:`error_bound`.
    """

    #: The name carried in frame metadata.
    name: ClassVar[str]
    #: The parts :meth:`encode` returns, always including :data:`DATA_PART`.
    parts: ClassVar[tuple[str, ...]] = (DATA_PART,)
    #: Whether every tensor crosses bit for bit (only then does training stay exact).
    exact: ClassVar[bool] = False
    #: One line for people choosing a codec.
    summary: ClassVar[str]

    @abstractmethod
    def applies_to(self, dtype: torch.dtype) -> bool:
        """Whether tensors of ``dtype`` are stored with this codec (else with ``none``)."""

    @abstractmethod
    def encode(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Turn a CPU tensor into its parts; raise :class:`CodecError` naming ``name``.

        Args:
            name: the tensor's name, used in error messages.
            tensor: a CPU tensor whose dtype this codec applies to. It is never modified.

        Returns:
            A dict with exactly the keys in :attr:`parts`.
        """

    @abstractmethod
    def decode(
        self, name: str, parts: Mapping[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        """Rebuild a tensor of the original ``dtype`` from received parts.

        Args:
            name: the tensor's name, used in error messages.
            parts: exactly the keys in :attr:`parts`, as received (untrusted).
            dtype: the original dtype declared by the sender.

        Returns:
            A tensor of ``dtype`` with the shape of the data part.

        Raises:
            FrameError: when the parts do not fit this codec (dtype, shape, values).
        """

    @abstractmethod
    def error_bound(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise bound on ``|x - decode(encode(x))|`` for a finite tensor ``x``.

        Returns:
            A float64 tensor of the same shape as ``tensor``.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _data_part(name: str, codec: str, parts: Mapping[str, torch.Tensor], dtype: torch.dtype):
    data = parts[DATA_PART]
    if data.dtype != dtype:
        raise FrameError(
            f"tensor {name!r}: codec {codec!r} stores {_dtype_name(dtype)}, "
            f"but the stored data is {_dtype_name(data.dtype)}"
        )
    return data


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class NoneCodec(Codec):
    """Stores every tensor as it is.

    Error bound: none. The decoded tensor equals the original bit for bit, NaN payloads,
    infinities and ``-0.0`` included.
    """

    name = "none"
    exact = True
    summary = "every tensor as it is, bit for bit: training stays exact"

    def applies_to(self, dtype: torch.dtype) -> bool:
        return True

    def encode(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        return {DATA_PART: tensor}

    def decode(
        self, name: str, parts: Mapping[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        return _data_part(name, self.name, parts, dtype)

    def error_bound(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros(tensor.shape, dtype=torch.float64)


class _CastCodec(Codec):
    """Casts 32- and 64-bit floats to a 16-bit float and back (variants set the dtype)."""

    wire_dtype: ClassVar[torch.dtype]

    def applies_to(self, dtype: torch.dtype) -> bool:
        # A 16-bit tensor has nothing to gain, and casting between the two 16-bit
        # formats would lose bits in both directions: those cross with `none`.
        return dtype in (torch.float32, torch.float64)

    def encode(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        cast = tensor.to(self.wire_dtype)
        # Infinities and NaN cross as themselves; a finite value that becomes infinite
        # would silently corrupt training, so it is refused. The cheap test comes first:
        # most tensors have no infinity at all.
        if not bool(torch.isinf(cast).any()):
            return {DATA_PART: cast}
        overflow = torch.isinf(cast) & torch.isfinite(tensor)
        if bool(overflow.any()):
            worst = float(tensor[overflow].abs().max())
            limit = torch.finfo(self.wire_dtype).max
            raise CodecError(
                f"tensor {name!r}: value of magnitude {worst:.6g} overflows {self.name} "
                f"(largest finite {limit:.6g}); use codec 'none' or 'int8', or rescale"
            )
        return {DATA_PART: cast}

    def decode(
        self, name: str, parts: Mapping[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        # Widening to float32/float64 is exact.
        return _data_part(name, self.name, parts, self.wire_dtype).to(dtype)

    def error_bound(self, tensor: torch.Tensor) -> torch.Tensor:
        x = tensor.to(torch.float64).abs()
        bound = torch.clamp(
            x * _UNIT_ROUNDOFF[self.wire_dtype], min=_HALF_SUBNORMAL[self.wire_dtype]
        )
        if tensor.dtype == torch.float64:
            # torch casts float64 to 16-bit through float32: that rounding adds at most
            # one float32 half-ulp (the double rounding can only matter near a tie).
            bound = bound + x * _UNIT_ROUNDOFF[torch.float32]
        return bound


class Fp16Codec(_CastCodec):
    """Casts float32/float64 tensors to IEEE half precision (float16) on the wire.

    Error bound: ``|x - x̂| <= max(2**-11 * |x|, 2**-25)`` for finite ``|x| <= 65504``
    (float64 input: plus ``2**-24 * |x|``, as torch casts it through float32).
    A finite value that overflows float16 raises :class:`CodecError` naming the tensor;
    NaN and infinities cross unchanged. float16/bfloat16 tensors cross with ``none``.
    """

    name = "fp16"
    summary = "floats as float16 on the wire: half the bytes, about 3 decimal digits kept"
    wire_dtype = torch.float16


class Bf16Codec(_CastCodec):
    """Casts float32/float64 tensors to bfloat16 on the wire.

    Error bound: ``|x - x̂| <= max(2**-8 * |x|, 2**-134)``, i.e. ``2**-8 * |x|`` for normal
    values (float64 input: plus ``2**-24 * |x|``, as torch casts it through float32).
    Only float64 values beyond about 3.39e38 overflow; they raise :class:`CodecError`.
    NaN and infinities cross unchanged. float16/bfloat16 tensors cross with ``none``.
    """

    name = "bf16"
    summary = "floats as bfloat16 on the wire: half the bytes, float32's range, 2-3 digits"
    wire_dtype = torch.bfloat16


class Int8Codec(Codec):
    """Per-tensor affine 8-bit quantization of floating tensors.

    With ``lo = min(x)``, ``hi = max(x)`` and ``step = (hi - lo) / 255``, each value is
    stored as ``q = round((x - lo) / step)`` in ``uint8``, plus ``step`` (part ``scale``)
    and ``lo`` (part ``offset``) as float64 scalars. The receiver computes
    ``lo + q * step`` in float64 and rounds once to the original dtype and shape.

    Error bound: ``|x - x̂| <= (hi - lo) / 510`` (half a level) plus one rounding of the
    original dtype (``u * max(|lo|, |hi|)`` with u = 2**-24 for float32, 2**-11 for
    float16, 2**-8 for bfloat16, plus that dtype's half subnormal spacing), plus
    ``2**-48 * max(|lo|, |hi|) + 2**-1066`` for the float64 arithmetic. Constant tensors
    round-trip exactly. Non-finite input raises :class:`CodecError`. float16 and
    bfloat16 tensors are quantized too; integer and bool tensors cross with ``none``.
    """

    name = "int8"
    summary = "floats as 8-bit levels of each tensor's range: a quarter of the bytes"
    parts = (DATA_PART, "scale", "offset")

    def applies_to(self, dtype: torch.dtype) -> bool:
        return dtype in FLOATING_DTYPES

    def encode(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if tensor.numel() == 0:
            lo, step = 0.0, 0.0
            q = torch.zeros(tensor.shape, dtype=torch.uint8)
        else:
            # min and max propagate NaN, and are infinite if any value is: one pass
            # finds the range and checks that every value is finite.
            lo_t, hi_t = torch.aminmax(tensor)
            lo, hi = float(lo_t), float(hi_t)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise CodecError(
                    f"tensor {name!r}: int8 cannot encode NaN or infinite values; "
                    "use codec 'none' or 'fp16'"
                )
            span = hi - lo
            if not math.isfinite(span):
                raise CodecError(
                    f"tensor {name!r}: range [{lo:.6g}, {hi:.6g}] is too wide for int8"
                )
            # A span of a few subnormals would make span / 255 underflow to 0; the
            # smallest float64 step still resolves such values exactly.
            step = max(span / 255.0, math.ulp(0.0)) if span > 0 else 0.0
            if step == 0.0:
                q = torch.zeros(tensor.shape, dtype=torch.uint8)
            else:
                # A private float64 copy, so the in-place steps never touch the caller's
                # tensor, and float64 keeps the arithmetic error far below half a level.
                x = tensor.to(torch.float64, copy=True)
                q = x.sub_(lo).div_(step).round_().clamp_(0, 255).to(torch.uint8)
        return {
            DATA_PART: q,
            "scale": torch.tensor(step, dtype=torch.float64),
            "offset": torch.tensor(lo, dtype=torch.float64),
        }

    def decode(
        self, name: str, parts: Mapping[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        q = _data_part(name, self.name, parts, torch.uint8)
        scale = self._scalar(name, "scale", parts["scale"])
        offset = self._scalar(name, "offset", parts["offset"])
        if scale < 0:
            raise FrameError(f"tensor {name!r}: int8 scale is negative ({scale!r})")
        if scale == 0.0:
            # Constant tensor: give back the exact value (also keeps -0.0).
            return torch.full(q.shape, offset, dtype=torch.float64).to(dtype)
        return q.to(torch.float64).mul_(scale).add_(offset).to(dtype)

    @staticmethod
    def _scalar(name: str, part: str, value: torch.Tensor) -> float:
        if value.dtype != torch.float64 or value.dim() != 0:
            raise FrameError(
                f"tensor {name!r}: int8 {part} must be a float64 scalar, got "
                f"{_dtype_name(value.dtype)} of shape {tuple(value.shape)}"
            )
        number = float(value)
        if not math.isfinite(number):
            raise FrameError(f"tensor {name!r}: int8 {part} is not finite ({number!r})")
        return number

    def error_bound(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.numel() == 0:
            return torch.zeros(tensor.shape, dtype=torch.float64)
        x = tensor.to(torch.float64)
        lo, hi = float(x.min()), float(x.max())
        magnitude = max(abs(lo), abs(hi))
        bound = (
            (hi - lo) / 510.0
            + (_UNIT_ROUNDOFF[tensor.dtype] + 2.0**-48) * magnitude
            + _HALF_SUBNORMAL[tensor.dtype]
            + 2.0**-1066  # float64 roundings of a subnormal step (float64 input only)
        )
        if hi == lo:
            bound = 0.0
        return torch.full(tensor.shape, bound, dtype=torch.float64)


#: Every codec by name.
CODECS: Mapping[str, Codec] = MappingProxyType(
    {codec.name: codec for codec in (NoneCodec(), Fp16Codec(), Bf16Codec(), Int8Codec())}
)


def describe_codecs() -> list[dict[str, object]]:
    """Every codec as the API and the dashboard show it: name, whether it is exact, and
    one line (``GET /api/codecs/``)."""
    return [
        {"name": codec.name, "exact": codec.exact, "summary": codec.summary}
        for codec in CODECS.values()
    ]


def get_codec(name: str) -> Codec:
    """The codec called ``name``.

    Raises:
        FrameError: for an unknown name (the message lists the known ones).
    """
    codec = CODECS.get(name) if isinstance(name, str) else None
    if codec is None:
        raise FrameError(f"unknown codec {name!r}; known codecs: {', '.join(CODECS)}")
    return codec
