"""Frames: round trips, what encode accepts, and a clear FrameError for every bad input."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
import safetensors.torch
import torch

from medsplit.errors import CodecError, FrameError
from medsplit.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    FrameKind,
    FrameMeta,
    FrameSpec,
    TensorSpec,
    decode_frame,
    encode_frame,
    raw_tensor_bytes,
)
from medsplit.wire.frame import FORMAT_KEY
from tests.medsplit.frame_samples import frame_metadata


def meta(**changes: object) -> FrameMeta:
    fields: dict[str, object] = {
        "job": "job-7",
        "round": 1,
        "position": 2,
        "step": 3,
        "kind": FrameKind.ACTIVATIONS,
        "mode": "vanilla",
    }
    fields.update(changes)
    return FrameMeta(**fields)  # type: ignore[arg-type]


def activations(codec: str = "none") -> Frame:
    generator = torch.Generator().manual_seed(0)
    return Frame(
        meta(codec=codec),
        {
            "features_denseblock1": torch.randn(4, 8, 3, 3, generator=generator),
            "labels": torch.tensor([0, 1, 1, 0]),
        },
    )


def good_metadata(**changes: str) -> dict[str, str]:
    """Metadata of a valid frame holding one float32 tensor ``x``."""
    return frame_metadata(**changes)


def craft(metadata: dict[str, str] | None, tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """Safetensors bytes with hand-made metadata, as a confused or hostile sender would."""
    if tensors is None:
        tensors = {"x": torch.zeros(2)}
    return safetensors.torch.save(tensors, metadata=metadata)


# ---------------------------------------------------------------------------- round trips


# What format version 2 writes: version 1's bytes (recorded when the mode field was an
# enum) with the marker "2" and the field "position" where version 1 wrote "turn". The
# header is compared as JSON (safetensors writes the metadata's keys in no set order) and
# the data section byte for byte.
GOLDEN = {
    ("vanilla", "none"): (
        {
            "labels": {"data_offsets": [0, 16], "dtype": "I64", "shape": [2]},
            "x": {"data_offsets": [16, 40], "dtype": "F32", "shape": [2, 3]},
        },
        "00000000000000000100000000000000000000000000803e0000003f0000403f0000803f0000a03f",
    ),
    ("ushaped", "int8"): (
        {
            "__offset/x": {"data_offsets": [16, 24], "dtype": "F64", "shape": []},
            "__scale/x": {"data_offsets": [24, 32], "dtype": "F64", "shape": []},
            "labels": {"data_offsets": [0, 16], "dtype": "I64", "shape": [2]},
            "x": {"data_offsets": [32, 38], "dtype": "U8", "shape": [2, 3]},
        },
        "000000000000000001000000000000000000000000000000141414141414743f00336699ccff",
    ),
}


@pytest.mark.parametrize(("mode", "codec"), sorted(GOLDEN))
def test_the_bytes_of_format_2_are_unchanged(mode: str, codec: str) -> None:
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
    frame = Frame(
        FrameMeta("job-7", 1, 2, 3, FrameKind.ACTIVATIONS, mode, codec),
        {"x": x, "labels": torch.tensor([0, 1])},
    )
    data = encode_frame(frame)
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    entries, body = GOLDEN[(mode, codec)]
    assert header.pop("__metadata__") == {
        "codec": codec,
        "job": "job-7",
        "kind": "activations",
        FORMAT_KEY: "2",
        "mode": mode,
        "position": "2",
        "round": "1",
        "step": "3",
        "tensors": '{"x":"float32","labels":"int64"}',
    }
    assert header == entries
    assert data[8 + size :].hex() == body


def test_a_frame_of_format_1_is_refused_naming_both_versions() -> None:
    """Version 1 called the position ``turn``: such a frame, complete and well formed in
    its own version, is refused before any field is read, saying what to do."""
    old = good_metadata(**{FORMAT_KEY: "1", "turn": "0"})
    del old["position"]
    with pytest.raises(
        FrameError,
        match=r"unsupported frame format version '1'; this code reads '2' only: .*upgrade",
    ):
        decode_frame(craft(old))


@pytest.mark.parametrize("codec", ["none", "fp16", "bf16", "int8"])
def test_round_trip_keeps_meta_names_order_dtypes_and_shapes(codec: str) -> None:
    frame = Frame(
        meta(codec=codec, kind="gradients", mode="ushaped"),
        {
            "z_last": torch.randn(3, 5),
            "labels": torch.tensor([2, 0, 1]),
            "loss": torch.tensor(0.25),
            "empty": torch.zeros(0, 4),
            "mask": torch.tensor([True, False]),
            "a_half": torch.randn(2).half(),
        },
    )
    decoded = decode_frame(encode_frame(frame))
    assert decoded.meta == frame.meta
    assert list(decoded.tensors) == list(frame.tensors)
    for name, tensor in frame.tensors.items():
        assert decoded.tensors[name].dtype == tensor.dtype
        assert decoded.tensors[name].shape == tensor.shape
    for name in ("labels", "mask", "empty"):
        assert torch.equal(decoded.tensors[name], frame.tensors[name])
    assert decoded.tensors["loss"].dim() == 0
    if codec == "none":
        for name, tensor in frame.tensors.items():
            assert torch.equal(decoded.tensors[name], tensor)


def test_lossy_codecs_shrink_the_frame() -> None:
    x = {"a": torch.randn(64, 64)}
    sizes = {c: len(encode_frame(Frame(meta(codec=c), x))) for c in ("none", "fp16", "int8")}
    assert sizes["fp16"] < 0.6 * sizes["none"]
    assert sizes["int8"] < 0.35 * sizes["none"]


def test_framing_overhead_is_small() -> None:
    frame = Frame(meta(), {"a": torch.randn(32, 256, 16, 16), "labels": torch.zeros(32).long()})
    assert len(encode_frame(frame)) <= 1.01 * raw_tensor_bytes(frame.tensors)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = encode_frame(activations())
    for view in (bytearray(data), memoryview(data), memoryview(bytearray(data)).cast("B")):
        decoded = decode_frame(view)
        assert decoded.meta == activations().meta


def test_decoded_tensors_are_writable_and_own_their_memory() -> None:
    data = bytearray(encode_frame(activations()))
    decoded = decode_frame(data)
    before = decoded.tensors["features_denseblock1"].clone()
    data[-40:] = bytes(40)  # the received buffer is reused by the channel
    decoded.tensors["features_denseblock1"].add_(1)  # must not crash or touch `data`
    assert torch.equal(decoded.tensors["features_denseblock1"], before + 1)


def test_raw_tensor_bytes() -> None:
    tensors = {
        "a": torch.zeros(3, 4),
        "b": torch.zeros(5, dtype=torch.int64),
        "c": torch.tensor(1.0),
    }
    assert raw_tensor_bytes(tensors) == 48 + 40 + 4
    assert raw_tensor_bytes({}) == 0


def test_empty_frame_round_trips() -> None:
    decoded = decode_frame(encode_frame(Frame(meta(), {})))
    assert dict(decoded.tensors) == {}


# ----------------------------------------------------------------------------- encoding


def test_encode_takes_any_layout_and_leaves_the_callers_tensors_alone() -> None:
    base = torch.randn(4, 6, requires_grad=True)
    transposed = base.t()  # not contiguous, and needs grad
    same = torch.arange(10.0)
    frame = Frame(
        meta(),
        {"t": transposed, "a": same, "b": same, "head": same[:5], "overlap": same[2:7]},
    )
    decoded = decode_frame(encode_frame(frame))
    assert torch.equal(decoded.tensors["t"], transposed.detach())
    assert not decoded.tensors["t"].requires_grad
    for name in ("a", "b"):
        assert torch.equal(decoded.tensors[name], same)
    assert torch.equal(decoded.tensors["overlap"], same[2:7])
    assert not transposed.is_contiguous()
    assert torch.equal(same, torch.arange(10.0))


def test_frame_copies_the_mapping() -> None:
    tensors = {"a": torch.zeros(1)}
    frame = Frame(meta(), tensors)
    tensors["b"] = torch.zeros(1)
    assert list(frame.tensors) == ["a"]
    with pytest.raises(TypeError):
        frame.tensors["c"] = torch.zeros(1)  # type: ignore[index]


@pytest.mark.parametrize("name", ["__scale/x", "__metadata__", "__x"])
def test_reserved_names_are_refused(name: str) -> None:
    with pytest.raises(FrameError, match=r"reserved"):
        Frame(meta(), {name: torch.zeros(1)})


@pytest.mark.parametrize("name", ["", 3, None])
def test_names_must_be_non_empty_strings(name: object) -> None:
    with pytest.raises(FrameError, match=r"non-empty strings"):
        Frame(meta(), {name: torch.zeros(1)})  # type: ignore[dict-item]


def test_values_must_be_tensors() -> None:
    with pytest.raises(FrameError, match=r"'a' is a list"):
        Frame(meta(), {"a": [1, 2]})  # type: ignore[dict-item]


def test_encode_refuses_dtypes_the_wire_does_not_carry() -> None:
    with pytest.raises(CodecError, match=r"'z'.*complex64.*allowed: float64"):
        encode_frame(Frame(meta(), {"z": torch.zeros(2, dtype=torch.complex64)}))


def test_encode_refuses_sparse_tensors() -> None:
    with pytest.raises(CodecError, match=r"'s'.*layout"):
        encode_frame(Frame(meta(), {"s": torch.eye(3).to_sparse()}))


def test_encode_refuses_meta_tensors() -> None:
    with pytest.raises(CodecError, match=r"'m'"):
        encode_frame(Frame(meta(), {"m": torch.empty(2, device="meta")}))


def test_encode_respects_max_bytes() -> None:
    frame = Frame(meta(), {"a": torch.zeros(1000)})
    with pytest.raises(CodecError, match=r"max_bytes=1000"):
        encode_frame(frame, max_bytes=1000)
    with pytest.raises(CodecError, match=r"encoded frame is \d+ bytes"):
        encode_frame(frame, max_bytes=4001)  # tensors fit, the header does not
    assert len(encode_frame(frame, max_bytes=5000)) <= 5000


def test_encode_reports_codec_errors_with_the_tensor_name() -> None:
    frame = Frame(meta(codec="fp16"), {"features_denseblock1": torch.tensor([1e6])})
    with pytest.raises(CodecError, match=r"'features_denseblock1'.*overflows"):
        encode_frame(frame)


def test_encode_needs_a_frame() -> None:
    with pytest.raises(CodecError, match=r"expected a Frame"):
        encode_frame({"a": torch.zeros(1)})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- FrameMeta


def test_meta_coerces_kind_and_keeps_the_mode_name() -> None:
    # The frame checks a mode's name, not that the mode is registered: the wire sits
    # below the mode registry, and receivers never read the field.
    m = meta(kind="head_gradients", mode="splitfed")
    assert m.kind is FrameKind.HEAD_GRADIENTS
    assert m.mode == "splitfed" and type(m.mode) is str
    assert m == meta(kind=FrameKind.HEAD_GRADIENTS, mode="splitfed")
    assert m.codec == "none"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"job": ""}, r"job must be"),
        ({"job": "x" * 129}, r"job must be"),
        ({"job": "a b"}, r"job must be"),
        ({"job": "job\n"}, r"job must be"),
        ({"job": 7}, r"job must be"),
        ({"round": -1}, r"round must not be negative"),
        ({"position": True}, r"position must be an int, got bool"),
        ({"step": 1.0}, r"step must be an int, got float"),
        ({"step": 2**63}, r"step must be below 2\*\*63"),
        ({"kind": "weights"}, r"unknown frame kind 'weights'; known: activations"),
        ({"mode": "Diagonal"}, r"mode must be a mode name.*got 'Diagonal'"),
        ({"mode": ""}, r"mode must be a mode name"),
        ({"mode": "m" * 17}, r"mode must be a mode name"),
        ({"mode": "a-b"}, r"mode must be a mode name"),
        ({"mode": 1}, r"mode must be a mode name.*got 1"),
        ({"codec": "zip"}, r"unknown codec 'zip'; known codecs: none, fp16, bf16, int8"),
    ],
)
def test_meta_validation(changes: dict[str, object], message: str) -> None:
    with pytest.raises(FrameError, match=message):
        meta(**changes)


def test_meta_accepts_its_limits() -> None:
    meta(job="A-z_0.9:" + "x" * 120, round=0, position=2**63 - 1)


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("frame", r"must be bytes.*got str"),
        (None, r"must be bytes.*got NoneType"),
        ([1, 2], r"must be bytes.*got list"),
        (b"", r"empty"),
        (b"\x05\x00", r"truncated"),
        (b"\xff" * 8 + b"{}", r"header claims \d+ bytes, only 2 follow"),
        (b"\x04\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}", r"not valid JSON"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00[]", r"not a JSON object"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}", r"no metadata"),
        (b"\x08\x00\x00\x00\x00\x00\x00\x00" + b"[" * 8, r"not valid JSON"),
    ],
)
def test_decode_refuses_garbage(data: object, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_frame(data)  # type: ignore[arg-type]


def test_deeply_nested_header_is_a_frame_error() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(FrameError, match=r"not valid JSON"):
        decode_frame(len(body).to_bytes(8, "little") + body)


def test_oversized_is_checked_before_parsing() -> None:
    with pytest.raises(FrameError, match=r"oversized: 101 bytes, more than max_bytes=100"):
        decode_frame(b"\x00" * 101, max_bytes=100)
    data = encode_frame(activations())
    with pytest.raises(FrameError, match=r"oversized"):
        decode_frame(memoryview(data), max_bytes=len(data) - 1)
    decode_frame(data, max_bytes=len(data))
    assert DEFAULT_MAX_FRAME_BYTES == 256 * 1024 * 1024


def test_truncated_frames_are_frame_errors() -> None:
    data = encode_frame(activations())
    for cut in (1, 7, 8, 20, len(data) // 2, len(data) - 1):
        with pytest.raises(FrameError, match=r"truncated"):
            decode_frame(data[:cut])


def test_plain_safetensors_is_not_a_frame() -> None:
    with pytest.raises(FrameError, match=r"no metadata.*'medsplit.frame' marker"):
        decode_frame(craft(None))
    with pytest.raises(FrameError, match=r"no 'medsplit.frame' marker"):
        decode_frame(craft({"format": "pt"}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({FORMAT_KEY: "3"}, r"unsupported frame format version '3'; this code reads '2'"),
        ({"step": "three"}, r"'step' is not an integer: 'three'"),
        ({"round": "1.0"}, r"'round' is not an integer"),
        ({"position": " 1"}, r"'position' is not an integer"),
        ({"position": "٣"}, r"'position' is not an integer"),
        ({"round": "-1"}, r"round must not be negative"),
        ({"step": "9" * 20}, r"step must be below 2\*\*63"),
        ({"kind": "weights"}, r"unknown frame kind 'weights'"),
        ({"mode": "side ways"}, r"mode must be a mode name.*'side ways'"),
        ({"codec": "lz4"}, r"unknown codec 'lz4'; known codecs: none, fp16, bf16, int8"),
        ({"job": "a/b"}, r"job must be"),
        ({"extra": "1"}, r"unknown field\(s\): 'extra'"),
        ({"tensors": "{"}, r"'tensors' is not valid JSON"),
        ({"tensors": "[]"}, r"'tensors' must be a JSON object"),
        ({"tensors": '{"x":"float32","x":"float32"}'}, r"'x' is listed twice"),
        ({"tensors": '{"x":"complex64"}'}, r"'x' declares dtype 'complex64'.*not allowed"),
        ({"tensors": '{"x":7}'}, r"'x' declares dtype 7"),
        ({"tensors": '{"x":"float16"}'}, r"'x'.*stores float16.*stored data is float32"),
        ({"tensors": '{"x":"float32","y":"int64"}'}, r"'y' \(codec 'none'\) is missing its data"),
        ({"tensors": "{}"}, r"not listed in its metadata: 'x'"),
        ({"tensors": '{"__x":"float32"}'}, r"reserved"),
    ],
)
def test_bad_metadata_is_named(changes: dict[str, str], message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_frame(craft(good_metadata(**changes)))


@pytest.mark.parametrize(
    "field", ["job", "round", "position", "step", "kind", "mode", "codec", "tensors"]
)
def test_missing_metadata_field_is_named(field: str) -> None:
    metadata = good_metadata()
    del metadata[field]
    with pytest.raises(FrameError, match=rf"lacks field\(s\): {field}"):
        decode_frame(craft(metadata))


def int8_parts() -> dict[str, torch.Tensor]:
    return {
        "x": torch.zeros(2, dtype=torch.uint8),
        "__scale/x": torch.tensor(0.5, dtype=torch.float64),
        "__offset/x": torch.tensor(-1.0, dtype=torch.float64),
    }


def test_crafted_int8_frame_decodes() -> None:
    frame = decode_frame(craft(good_metadata(codec="int8"), int8_parts()))
    assert torch.equal(frame.tensors["x"], torch.tensor([-1.0, -1.0]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.pop("__scale/x"), r"'x' \(codec 'int8'\) is missing part 'scale'"),
        (lambda p: p.pop("__offset/x"), r"missing part 'offset'"),
        (lambda p: p.update(x=torch.zeros(2)), r"'x'.*stores uint8.*float32"),
        (lambda p: p.update({"__scale/x": torch.tensor(0.5)}), r"scale must be a float64 scalar"),
        (lambda p: p.update({"__scale/x": torch.tensor(-0.5).double()}), r"scale is negative"),
        (lambda p: p.update({"__offset/x": torch.tensor(math.nan).double()}), r"not finite"),
        (lambda p: p.update({"__scale/y": torch.tensor(1.0)}), r"not listed.*'__scale/y'"),
    ],
)
def test_inconsistent_codec_parts_are_named(
    edit: Callable[[dict[str, torch.Tensor]], object], message: str
) -> None:
    parts = int8_parts()
    edit(parts)
    with pytest.raises(FrameError, match=message):
        decode_frame(craft(good_metadata(codec="int8"), parts))


def test_integer_tensors_in_an_int8_frame_are_stored_plainly() -> None:
    labels = torch.tensor([3, 1, 2])
    data = encode_frame(Frame(meta(codec="int8"), {"labels": labels}))
    assert b"__scale" not in data
    assert torch.equal(decode_frame(data).tensors["labels"], labels)


# ------------------------------------------------------------------------------ expect


def spec(**tensors: TensorSpec) -> FrameSpec:
    return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=tensors)


def test_expect_accepts_a_matching_frame_with_any_batch() -> None:
    data = encode_frame(activations())
    expected = spec(
        features_denseblock1=TensorSpec((None, 8, 3, 3), torch.float32),
        labels=TensorSpec((None,), torch.int64),
    )
    assert decode_frame(data, expect=expected).meta.step == 3
    assert decode_frame(data, expect=FrameSpec(kind="activations")).meta.position == 2
    assert decode_frame(data, expect=FrameSpec()).meta.round == 1


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        (FrameSpec(kind=FrameKind.GRADIENTS), r"expected a 'gradients' frame, got 'activations'"),
        (
            spec(labels=TensorSpec((None,), torch.int64)),
            r"missing none, unexpected \['features_denseblock1'\]",
        ),
        (
            spec(
                features_denseblock1=TensorSpec((None, 8, 3, 3), torch.float32),
                labels=TensorSpec((None,), torch.int64),
                loss=TensorSpec((), torch.float32),
            ),
            r"missing \['loss'\], unexpected none",
        ),
        (
            spec(
                features_denseblock1=TensorSpec((None, 8, 3, 3), torch.float64),
                labels=TensorSpec((None,), torch.int64),
            ),
            r"'features_denseblock1': expected dtype torch.float64, got torch.float32",
        ),
        (
            spec(
                features_denseblock1=TensorSpec((None, 16, 3, 3), torch.float32),
                labels=TensorSpec((None,), torch.int64),
            ),
            r"expected shape \('\*', 16, 3, 3\) \(\* = any\), got \(4, 8, 3, 3\)",
        ),
        (
            spec(
                features_denseblock1=TensorSpec((None, 8, 3, 3), torch.float32),
                labels=TensorSpec((None, 1), torch.int64),
            ),
            r"'labels': expected shape \('\*', 1\).*got \(4,\)",
        ),
    ],
)
def test_expect_names_the_mismatch(expected: FrameSpec, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_frame(encode_frame(activations()), expect=expected)


def test_optional_names_may_be_absent_but_must_match_when_present() -> None:
    data = encode_frame(activations())
    grads = TensorSpec((None, 8, 3, 3), torch.float32)
    labels = TensorSpec((None,), torch.int64)
    loss = TensorSpec((), torch.float32)
    optional_loss = FrameSpec(
        kind=FrameKind.ACTIVATIONS,
        tensors={"features_denseblock1": grads, "labels": labels, "loss": loss},
        optional=frozenset({"loss"}),
    )
    assert set(decode_frame(data, expect=optional_loss).tensors) == {
        "features_denseblock1",
        "labels",
    }
    wrong_when_present = FrameSpec(
        kind=FrameKind.ACTIVATIONS,
        tensors={
            "features_denseblock1": TensorSpec((None, 9, 3, 3), torch.float32),
            "labels": labels,
        },
        optional=frozenset({"features_denseblock1"}),
    )
    with pytest.raises(FrameError, match=r"'features_denseblock1': expected shape"):
        decode_frame(data, expect=wrong_when_present)
    with pytest.raises(ValueError, match=r"optional names"):
        FrameSpec(tensors={"a": loss}, optional=frozenset({"b"}))


def test_specs_check_their_arguments() -> None:
    with pytest.raises(ValueError, match=r"shape entries"):
        TensorSpec((-1,), torch.float32)
    with pytest.raises(ValueError, match=r"dtype"):
        TensorSpec((1,), "float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown frame kind"):
        FrameSpec(kind="weights")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"TensorSpec"):
        FrameSpec(tensors={"a": (1,)})  # type: ignore[dict-item]
    assert TensorSpec([None, 3], torch.float32).shape == (None, 3)  # type: ignore[arg-type]
