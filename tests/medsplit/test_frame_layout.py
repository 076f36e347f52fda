"""The safetensors layout written and read by ``medsplit.wire.layout``: the library reads
what it writes and it reads what the library writes, bit for bit, and it refuses, naming
what is wrong, every header the library refuses (and dtypes no frame holds, and bools that are not 0
or 1)."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medsplit.errors import FrameError
from medsplit.wire import ALLOWED_DTYPES, layout

METADATA = {"kind": "activations", "note": 'é " \\ ✓'}


def every_dtype() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        str(dtype).removeprefix("torch."): torch.randint(0, 2, (2, 3), generator=gen).to(dtype)
        for dtype in layout.STORED_DTYPES.values()
    }
    tensors["x"] = torch.randn(4, 5, generator=gen)
    tensors["loss"] = torch.tensor(0.25)  # 0-d
    tensors["empty"] = torch.empty(0, 3, dtype=torch.float16)
    return tensors


def split(data: bytes) -> tuple[dict[str, object], bytes]:
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and torch.equal(bits(a[k]), bits(b[k]))
        for k in a
    )


def read(data: bytes) -> dict[str, torch.Tensor]:
    header, start = layout.read_header(data)
    return layout.read_tensors(data, header, start)


def test_what_is_written_is_what_the_library_writes() -> None:
    tensors = every_dtype()
    ours, theirs = layout.write(tensors, METADATA), safetensors.torch.save(tensors, METADATA)
    assert len(ours) == len(theirs) and (int.from_bytes(ours[:8], "little") % 8) == 0
    assert split(ours) == split(theirs)  # the header as JSON: the library's key order varies


def test_each_reads_the_others_bytes_bit_for_bit() -> None:
    tensors = every_dtype()
    assert same(safetensors.torch.load(layout.write(tensors, METADATA)), tensors)
    assert same(read(safetensors.torch.save(tensors, METADATA)), tensors)
    header, _ = layout.read_header(layout.write(tensors, METADATA))
    assert header["__metadata__"] == METADATA


def test_every_dtype_a_frame_may_hold_is_one_the_layout_stores() -> None:
    assert set(ALLOWED_DTYPES.values()) == set(layout.STORED_DTYPES.values())


def test_tensors_read_own_their_memory() -> None:
    data = layout.write({"x": torch.zeros(3), "y": torch.ones(2, dtype=torch.int64)}, {})
    before = bytes(data)
    tensors = read(data)
    tensors["x"] += 1  # a receiver may change what it got
    tensors["y"][0] = 7
    assert data == before and torch.equal(read(data)["x"], torch.zeros(3))


def test_another_writers_unaligned_layout_is_read() -> None:
    """The format does not demand alignment: a one-byte tensor first puts a float after it
    at an odd offset, and an unpadded header at an odd start."""
    x = torch.randn(3)
    header = {
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "x": {"dtype": "F32", "shape": [3], "data_offsets": [1, 13]},
    }
    text = json.dumps(header).encode() + b" "  # odd length
    data = len(text).to_bytes(8, "little") + text + b"\x05" + x.numpy().tobytes()
    got = read(data)
    assert torch.equal(got["x"], x) and got["a"].tolist() == [5]
    assert same(got, safetensors.torch.load(data))


def entry(dtype: str = "F32", shape: object = (2,), offsets: object = (0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}  # type: ignore[call-overload]


def crafted(
    header: dict[str, object], payload: bytes = bytes(8), *, raw: bytes | None = None
) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + payload


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (crafted({"x": entry("Q99")}), r"'x': stored dtype 'Q99' is not one of I64, F64"),
        (crafted({"x": entry(shape=(-2,))}), r"'x': shape \[-2\] is not a list of sizes"),
        (crafted({"x": entry(shape=(True,))}), r"'x': shape \[True\] is not a list of sizes"),
        (crafted({"x": entry(offsets=(8, 0))}), r"'x': data_offsets \[8, 0\] is not a range"),
        (
            crafted({"x": entry(offsets=(0, 4))}),
            r"'x': shape \[2\] of F32 takes 8 bytes, its range holds 4",
        ),
        (
            crafted({"x": {"dtype": "F32", "shape": [2]}}),
            r"'x': its header entry must hold exactly",
        ),
        (
            crafted({"x": entry(), "y": entry(offsets=(4, 12))}, bytes(12)),
            r"'y': its bytes start at 4, which overlaps",
        ),
        (
            crafted({"x": entry(offsets=(4, 12))}, bytes(12)),
            r"'x': its bytes start at 4, which leaves a gap",
        ),
        (
            crafted({"x": entry()}, bytes(4)),
            r"truncated: tensors need 8 bytes, 4 follow the header",
        ),
        (crafted({"x": entry()}, bytes(9)), r"holds 1 bytes after its last tensor"),
        (crafted({}, raw=b'{"x":{},"x":{}}'), r"header lists 'x' twice"),
        (
            crafted({"x": entry("BOOL", (2,), (0, 2))}, b"\x01\x02"),
            r"'x' is bool but holds bytes other than 0 and 1",
        ),
        (crafted({}, raw=b"[1]"), r"not a JSON object"),
        (crafted({}, raw=b"{\xff}"), r"not valid JSON"),
        (b"\x05\x00", r"truncated: 2 bytes"),
        (b"\xff" * 8 + b"{}", r"header claims \d+ bytes, only 2 follow"),
    ],
)
def test_hostile_layouts_are_refused_by_name(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        read(data)


_DTYPES = [*layout.STORED_DTYPES, "U16", "C64", "F8_E4M3", "?"]


@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.dictionaries(
        st.sampled_from(["x", "y", "z"]),
        st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(_DTYPES),
                "shape": st.lists(st.integers(-1, 6), max_size=3),
                "data_offsets": st.lists(st.integers(-1, 40), min_size=2, max_size=2),
            }
        ),
        max_size=3,
    ),
    payload=st.binary(max_size=40),
)
def test_it_accepts_exactly_what_the_library_accepts(entries: dict, payload: bytes) -> None:
    data = crafted(entries, payload)
    try:
        ours = read(data)
    except FrameError:
        ours = None
    try:
        theirs = safetensors.torch.load(data)
    except Exception:
        theirs = None
    if ours is not None:
        assert theirs is not None and same(ours, theirs)
    elif theirs is not None:  # stricter only on dtypes a frame never holds, and bools
        assert any(
            t.dtype not in layout.STORED_DTYPES.values()
            or (t.dtype == torch.bool and bool((t.view(torch.uint8) > 1).any()))
            for t in theirs.values()
        )
