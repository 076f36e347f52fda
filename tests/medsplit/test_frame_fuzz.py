"""Fuzzing decode_frame: any input gives a Frame or a FrameError, quickly; none round-trips.

Property tests with hypothesis. Each input is decoded under hypothesis' deadline, so a
decode that hangs or takes seconds on a small hostile input fails the test.
"""

from __future__ import annotations

import json
import math

import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medsplit.errors import FrameError
from medsplit.wire import (
    ALLOWED_DTYPES,
    RESERVED_PREFIX,
    Frame,
    FrameKind,
    FrameMeta,
    decode_frame,
    encode_frame,
)
from medsplit.wire.frame import FORMAT_KEY
from tests.medsplit.frame_samples import frame_metadata

FUZZ = settings(
    max_examples=300,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode_or_frame_error(data: bytes) -> Frame | None:
    """The property under test: a Frame, or FrameError; any other exception fails."""
    try:
        frame = decode_frame(data)
    except FrameError as e:
        assert str(e)  # every error says what was wrong
        return None
    assert isinstance(frame, Frame)
    return frame


# ----------------------------------------------------------------------------- inputs

names = st.text(min_size=1, max_size=12).filter(lambda n: not n.startswith(RESERVED_PREFIX))
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
metas = st.builds(
    FrameMeta,
    job=st.from_regex(r"[A-Za-z0-9_.:-]{1,128}", fullmatch=True),
    round=st.integers(0, 2**63 - 1),
    position=st.integers(0, 2**63 - 1),
    step=st.integers(0, 2**63 - 1),
    kind=st.sampled_from(FrameKind),
    mode=st.sampled_from(["vanilla", "ushaped", "vertical", "splitfed"]),
)
_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any allowed dtype and shape, with arbitrary bit patterns (NaN payloads, -0.0)."""
    dtype = draw(st.sampled_from(list(ALLOWED_DTYPES.values())))
    shape = draw(shapes)
    numel = math.prod(shape)
    if dtype == torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=numel, max_size=numel)))
    size = numel * dtype.itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


frames = st.builds(Frame, meta=metas, tensors=st.dictionaries(names, tensors(), max_size=5))


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.bool else tensor.view(_BITS[tensor.element_size()])


def small_frame(codec: str = "none") -> bytes:
    meta = FrameMeta("job", 1, 2, 3, FrameKind.GRADIENTS, "ushaped", codec)
    return encode_frame(
        Frame(
            meta,
            {"grad": torch.randn(2, 3), "loss": torch.tensor(0.5), "labels": torch.arange(2)},
        )
    )


VALID = {codec: small_frame(codec) for codec in ("none", "fp16", "bf16", "int8")}


# ------------------------------------------------------------------------- properties


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    decode_or_frame_error(data)


@FUZZ
@given(st.binary(max_size=256), st.integers(0, 1024))
def test_random_bytes_behind_a_plausible_header_length(body: bytes, claimed: int) -> None:
    decode_or_frame_error(claimed.to_bytes(8, "little") + body)


@FUZZ
@given(
    codec=st.sampled_from(sorted(VALID)),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=8),
)
def test_byte_flips(codec: str, flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID[codec])
    for where, mask in flips:
        data[where % len(data)] ^= mask
    decode_or_frame_error(bytes(data))


@FUZZ
@given(
    codec=st.sampled_from(sorted(VALID)),
    start=st.integers(0, 10**6),
    length=st.integers(0, 64),
    insert=st.binary(max_size=16),
)
def test_truncations_cuts_and_insertions(
    codec: str, start: int, length: int, insert: bytes
) -> None:
    data = VALID[codec]
    start %= len(data) + 1
    decode_or_frame_error(data[:start])
    decode_or_frame_error(data[:start] + insert + data[start + length :])


@FUZZ
@given(
    codec=st.sampled_from(sorted(VALID)),
    where=st.integers(0, 10**6),
    text=st.text(max_size=8),
)
def test_header_edits(codec: str, where: int, text: str) -> None:
    # Edits inside the JSON header that keep its length field right, so parsing goes deep.
    data = VALID[codec]
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size].decode()
    where %= size + 1
    edited = (header[:where] + text + header[where + len(text) :]).encode()
    decode_or_frame_error(len(edited).to_bytes(8, "little") + edited + data[8 + size :])


_FIELDS = [FORMAT_KEY, "job", "round", "position", "step", "kind", "mode", "codec", "tensors"]
_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["1", "0", "-1", "activations", "vanilla", "none", "int8", "fp16", "{}"]),
    st.integers(-(2**70), 2**70).map(str),
    st.dictionaries(
        st.text(max_size=6), st.sampled_from([*ALLOWED_DTYPES, "complex64", "x"]), max_size=3
    ).map(json.dumps),
)


@FUZZ
@given(
    changes=st.dictionaries(st.one_of(st.sampled_from(_FIELDS), st.text(max_size=6)), _VALUES),
    drop=st.sets(st.sampled_from(_FIELDS)),
    stored=st.dictionaries(
        st.sampled_from(["x", "y", "__scale/x", "__offset/x", "__metadata"]),
        tensors(),
        max_size=4,
    ),
)
def test_valid_safetensors_with_bad_metadata(
    changes: dict[str, str], drop: set[str], stored: dict[str, torch.Tensor]
) -> None:
    metadata = frame_metadata({name: str(t.dtype)[6:] for name, t in stored.items()})
    metadata.update(changes)
    for field in drop:
        metadata.pop(field, None)
    decode_or_frame_error(safetensors.torch.save(stored, metadata=metadata))


_ST_DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I8", "U8", "BOOL", "U16", "C64", "F8_E4M3", "?"]


@FUZZ
@given(
    entries=st.dictionaries(
        st.sampled_from(["x", "y", "__scale/x"]),
        st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(_ST_DTYPES),
                "shape": st.lists(st.integers(-1, 2**40), max_size=4),
                "data_offsets": st.lists(st.integers(-1, 80), min_size=2, max_size=2),
            }
        ),
        max_size=3,
    ),
    codec=st.sampled_from(["none", "int8", "fp16"]),
    payload=st.binary(max_size=80),
)
def test_hostile_tensor_headers(entries: dict[str, object], codec: str, payload: bytes) -> None:
    metadata = frame_metadata({"x": "float32", "y": "int64"}, codec=codec)
    header = json.dumps({"__metadata__": metadata, **entries}).encode()
    decode_or_frame_error(len(header).to_bytes(8, "little") + header + payload)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(frames)
def test_none_round_trip_is_bit_exact(frame: Frame) -> None:
    decoded = decode_frame(encode_frame(frame))
    assert decoded.meta == frame.meta
    assert list(decoded.tensors) == list(frame.tensors)
    for name, tensor in frame.tensors.items():
        got = decoded.tensors[name]
        assert got.dtype == tensor.dtype
        assert got.shape == tensor.shape
        assert torch.equal(bits(got), bits(tensor))
