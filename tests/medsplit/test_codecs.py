"""Codecs: each documented error bound holds, exact codecs are exact, limits are refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from medsplit.errors import CodecError, FrameError
from medsplit.wire.codecs import CODECS, DATA_PART, Codec, get_codec, part_key

FP16_MAX = 65504.0
BF16_MAX = (2 - 2**-7) * 2.0**127  # bfloat16's largest finite value, about 3.3895e38


def round_trip(codec: Codec, tensor: torch.Tensor) -> torch.Tensor:
    parts = codec.encode("t", tensor)
    assert set(parts) == set(codec.parts)
    return codec.decode("t", parts, tensor.dtype)


@st.composite
def shapes(draw: st.DrawFn, max_dims: int = 3) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(0, 5), max_size=max_dims)))


@st.composite
def float_tensors(
    draw: st.DrawFn,
    dtype: torch.dtype,
    limit: float | None = None,
    min_numel: int = 0,
) -> torch.Tensor:
    """Finite tensors of ``dtype`` with |x| <= limit, any shape (0-dim and empty included).

    ``limit`` must be exactly representable in ``dtype`` (hypothesis insists).
    """
    shape = draw(shapes())
    numel = math.prod(shape)
    if numel < min_numel:
        shape, numel = (min_numel,), min_numel
    width = {torch.float64: 64, torch.float16: 16}.get(dtype, 32)
    elements = st.floats(
        min_value=-limit if limit is not None else None,
        max_value=limit,
        allow_nan=False,
        allow_infinity=False,
        width=width,
    )
    values = draw(st.lists(elements, min_size=numel, max_size=numel))
    tensor = torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)
    assert bool(torch.isfinite(tensor).all())
    return tensor


def assert_within_bound(codec: Codec, x: torch.Tensor) -> None:
    y = round_trip(codec, x)
    assert y.dtype == x.dtype
    assert y.shape == x.shape
    error = (y.to(torch.float64) - x.to(torch.float64)).abs()
    bound = codec.error_bound(x)
    assert bound.shape == x.shape
    bad = error > bound
    assert not bool(bad.any()), (x[bad], y[bad], error[bad], bound[bad])


# ------------------------------------------------------------------------------ none


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """View a tensor as integers of the same width, so NaN payloads and -0.0 compare."""
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    if tensor.dtype == torch.bool:
        return tensor
    return tensor.view(width[tensor.element_size()])


@settings(max_examples=100, deadline=2000)
@given(st.data())
def test_none_is_bit_exact(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32, torch.float16]))
    x = data.draw(float_tensors(dtype))
    y = round_trip(CODECS["none"], x)
    assert torch.equal(y, x)
    assert torch.equal(as_bits(y), as_bits(x))


def test_none_keeps_nan_payloads_infinities_and_negative_zero() -> None:
    bits = torch.tensor([0x7FC00001, -0x3E00_0000, 0x7F800000, -0x00800000, -(2**31)])
    x = bits.to(torch.int32).view(torch.float32)
    y = round_trip(CODECS["none"], x)
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))
    assert math.copysign(1.0, float(y[-1])) == -1.0


def test_none_refuses_a_data_part_of_another_dtype() -> None:
    with pytest.raises(FrameError, match=r"stores float32.*float16"):
        CODECS["none"].decode("t", {DATA_PART: torch.zeros(2, dtype=torch.float16)}, torch.float32)


# ---------------------------------------------------------------------------- fp16/bf16


@settings(max_examples=150, deadline=2000)
@given(st.data())
def test_fp16_bound(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    assert_within_bound(CODECS["fp16"], data.draw(float_tensors(dtype, limit=FP16_MAX)))


@settings(max_examples=150, deadline=2000)
@given(st.data())
def test_bf16_bound(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    assert_within_bound(CODECS["bf16"], data.draw(float_tensors(dtype, limit=BF16_MAX)))


def test_fp16_bound_formula_matches_the_docstring() -> None:
    x = torch.tensor([0.0, 2.0**-30, 1.0, -3.0, 60000.0])
    expected = torch.tensor([2.0**-25, 2.0**-25, 2.0**-11, 3 * 2.0**-11, 60000 * 2.0**-11])
    assert torch.equal(CODECS["fp16"].error_bound(x), expected.double())
    assert "2**-11" in (type(CODECS["fp16"]).__doc__ or "")


def test_bf16_bound_is_relative_for_normal_values() -> None:
    x = torch.tensor([1.0, -1e30, 1e-30])
    assert torch.equal(CODECS["bf16"].error_bound(x), x.double().abs() * 2.0**-8)
    assert "2**-8" in (type(CODECS["bf16"]).__doc__ or "")


@pytest.mark.parametrize(("name", "exponent"), [("fp16", -24), ("bf16", -133)])
def test_float64_double_rounding_is_inside_the_bound(name: str, exponent: int) -> None:
    # Just above a tie between two 16-bit subnormals: float32 drops the excess, then the
    # tie rounds to even, away from x. Single rounding would stay within half a spacing.
    x = torch.tensor([2.5 * 2.0**exponent + 2.0 ** (exponent - 36)], dtype=torch.float64)
    error = (round_trip(CODECS[name], x) - x).abs()
    assert bool(error > 2.0 ** (exponent - 1))  # more than a single rounding's worth
    assert bool(error <= CODECS[name].error_bound(x))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_codecs_store_16_bits_and_give_back_the_original_dtype(name: str) -> None:
    x = torch.linspace(-3, 3, 50, dtype=torch.float64)
    parts = CODECS[name].encode("t", x)
    assert parts[DATA_PART].element_size() == 2
    assert CODECS[name].decode("t", parts, torch.float64).dtype == torch.float64


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_codecs_pass_16_bit_and_integer_tensors_through(name: str) -> None:
    codec = CODECS[name]
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool):
        assert not codec.applies_to(dtype)
    assert codec.applies_to(torch.float32)
    assert codec.applies_to(torch.float64)


def test_fp16_overflow_names_the_tensor() -> None:
    x = torch.tensor([1.0, 70000.0])
    with pytest.raises(CodecError, match=r"'features_denseblock1'.*overflows fp16"):
        CODECS["fp16"].encode("features_denseblock1", x)
    # 65519 still rounds to 65504; 65520 rounds to infinity.
    CODECS["fp16"].encode("t", torch.tensor([65519.0]))
    with pytest.raises(CodecError):
        CODECS["fp16"].encode("t", torch.tensor([-65520.0]))


def test_bf16_overflow_from_float64_is_refused() -> None:
    with pytest.raises(CodecError, match=r"'big'.*overflows bf16"):
        CODECS["bf16"].encode("big", torch.tensor([1e39], dtype=torch.float64))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_codecs_keep_non_finite_values(name: str) -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    y = round_trip(CODECS[name], x)
    assert torch.isnan(y[0])
    assert torch.equal(y[1:], x[1:])


# ------------------------------------------------------------------------------ int8


@settings(max_examples=200, deadline=2000)
@given(st.data())
def test_int8_bound(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64, torch.float16]))
    # Narrow and wide ranges: subnormal-scale steps as well as huge spans.
    if dtype == torch.float16:
        limits = [2.0**-20, 1.0, 1024.0, FP16_MAX]
    else:
        limits = [2.0**-100, 1.0, 1e6, 2.0**100]
    limit = data.draw(st.sampled_from(limits))
    assert_within_bound(CODECS["int8"], data.draw(float_tensors(dtype, limit=limit)))


@settings(max_examples=50, deadline=2000)
@given(st.data())
def test_int8_bound_bfloat16(data: st.DataObject) -> None:
    x = data.draw(float_tensors(torch.float32, limit=1e6)).to(torch.bfloat16)
    assert_within_bound(CODECS["int8"], x)


def test_int8_bound_is_the_documented_formula() -> None:
    x = torch.tensor([-1.0, 0.5, 4.0])
    bound = float(CODECS["int8"].error_bound(x)[0])
    expected = 5.0 / 510 + (2.0**-24 + 2.0**-48) * 4.0 + 2.0**-150 + 2.0**-1066
    assert bound == expected
    assert "(hi - lo) / 510" in (type(CODECS["int8"]).__doc__ or "")


def test_int8_is_tight_enough_to_be_useful() -> None:
    # The bound is about half a level: a real tensor lands well inside it, not at zero
    # (so a codec that stored nothing would fail the bound tests above).
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    y = round_trip(CODECS["int8"], x)
    error = (y - x).abs().max()
    span = float(x.max() - x.min())
    assert span / 2000 < error <= span / 510 * (1 + 1e-6)


@pytest.mark.parametrize("value", [0.0, -0.0, 3.25, -1e30, 2.0**-140])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_int8_constant_tensors_are_exact(value: float, dtype: torch.dtype) -> None:
    x = torch.full((3, 4), value, dtype=dtype)
    y = round_trip(CODECS["int8"], x)
    assert torch.equal(as_bits(y), as_bits(x))


def test_int8_stores_uint8_and_keeps_shape_dtype_and_the_callers_tensor() -> None:
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    before = x.clone()
    parts = CODECS["int8"].encode("t", x)
    assert parts[DATA_PART].dtype == torch.uint8
    assert parts["scale"].dtype == parts["offset"].dtype == torch.float64
    y = CODECS["int8"].decode("t", parts, torch.float64)
    assert y.shape == x.shape and y.dtype == torch.float64
    assert torch.equal(x, before)


def test_int8_empty_and_scalar() -> None:
    for x in (torch.zeros(0, 7), torch.tensor(2.5)):
        y = round_trip(CODECS["int8"], x)
        assert y.shape == x.shape and torch.equal(y, x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_int8_refuses_non_finite_input(bad: float) -> None:
    with pytest.raises(CodecError, match=r"'act'.*NaN or infinite"):
        CODECS["int8"].encode("act", torch.tensor([1.0, bad]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("where", [0, 500, 1022, 1023])
def test_int8_finds_a_nan_anywhere(dtype: torch.dtype, where: int) -> None:
    x = torch.randn(1024).to(dtype)
    x[where] = float("nan")
    with pytest.raises(CodecError, match=r"NaN"):
        CODECS["int8"].encode("t", x)


def test_fp16_finds_an_overflow_anywhere() -> None:
    x = torch.randn(1000)
    x[777] = -1e5
    with pytest.raises(CodecError, match=r"magnitude 100000 overflows fp16"):
        CODECS["fp16"].encode("t", x)


def test_int8_refuses_a_range_wider_than_float64() -> None:
    with pytest.raises(CodecError, match=r"too wide"):
        CODECS["int8"].encode("t", torch.tensor([-1e308, 1e308], dtype=torch.float64))


@pytest.mark.parametrize(
    ("scale", "offset", "message"),
    [
        (torch.tensor(-1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64), "neg"),
        (torch.tensor(1.0), torch.tensor(0.0, dtype=torch.float64), "float64 scalar"),
        (torch.ones(2, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64), "scalar"),
        (torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(0.0).double(), "finite"),
        (torch.tensor(1.0, dtype=torch.float64), torch.tensor(float("inf")).double(), "finite"),
    ],
)
def test_int8_decode_checks_its_parameters(
    scale: torch.Tensor, offset: torch.Tensor, message: str
) -> None:
    parts = {DATA_PART: torch.zeros(3, dtype=torch.uint8), "scale": scale, "offset": offset}
    with pytest.raises(FrameError, match=message):
        CODECS["int8"].decode("t", parts, torch.float32)


def test_int8_decode_refuses_non_uint8_data() -> None:
    parts = CODECS["int8"].encode("t", torch.randn(4))
    parts[DATA_PART] = parts[DATA_PART].to(torch.int8)
    with pytest.raises(FrameError, match=r"uint8.*int8"):
        CODECS["int8"].decode("t", parts, torch.float32)


# ---------------------------------------------------------------------------- registry


def test_registry_names() -> None:
    assert list(CODECS) == ["none", "fp16", "bf16", "int8"]
    for name, codec in CODECS.items():
        assert get_codec(name) is codec
        assert codec.name == name
        assert DATA_PART in codec.parts
        assert "bound" in (type(codec).__doc__ or "").lower()


@pytest.mark.parametrize("bad", ["zstd", "", "NONE", None, 3])
def test_unknown_codec_names_the_known_ones(bad: object) -> None:
    with pytest.raises(FrameError, match=r"none, fp16, bf16, int8"):
        get_codec(bad)  # type: ignore[arg-type]


def test_integer_tensors_are_never_coded() -> None:
    for codec in CODECS.values():
        for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
            assert codec.applies_to(dtype) == (codec.name == "none")


def test_part_keys_are_reserved() -> None:
    assert part_key("x", DATA_PART) == "x"
    assert part_key("x", "scale").startswith("__")
    assert part_key("a/b", "scale") != part_key("a", "scale")


def test_each_codec_describes_itself_and_only_none_is_exact() -> None:
    from medsplit.wire.codecs import describe_codecs

    described = describe_codecs()
    assert [c["name"] for c in described] == list(CODECS)
    assert {c["name"]: c["exact"] for c in described} == {
        "none": True,
        "fp16": False,
        "bf16": False,
        "int8": False,
    }
    assert all(c["summary"] and "\n" not in c["summary"] for c in described)
