"""The safetensors layout of a frame, written and read here rather than by the library.

The layout (https://huggingface.co/docs/safetensors, "Format") is eight bytes of header
length (little-endian), a JSON header naming each tensor's dtype, shape and byte range,
padded with spaces to a multiple of eight, then the tensors' bytes with no gaps. What is
written here is what ``safetensors.torch.save`` writes (the same order and offsets; only
the order of the metadata's keys, which the library leaves to a hash map, may differ), and
either side reads the other's bytes (``tests/medsplit/test_frame_layout.py``).

Why not the library: on a short step its Python wrapper (numpy views of each tensor, a
search for shared storage, a second copy of the result into ``bytes``) cost 0.2-0.3 ms
per 0.8 MB frame, and reading parsed the header a second time after the frame's own
checks had parsed it (``docs/benchmarks.md``, "Where a short step goes"). The reader
checks everything the library checks, and besides refuses dtypes no frame holds and a
``bool`` byte other than 0 or 1.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from medsplit.errors import FrameError

__all__ = [
    "HEADER_LENGTH_BYTES",
    "STORED_DTYPES",
    "read_header",
    "read_tensors",
    "unique_keys",
    "write",
]

if sys.byteorder != "little":  # pragma: no cover - no such machine runs torch here
    raise ImportError("medsplit's wire format is little-endian; this machine is not")

HEADER_LENGTH_BYTES = 8
_METADATA = "__metadata__"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})

#: Each dtype a frame may store, by its safetensors name, in the library's order of
#: writing: widest first (so every tensor starts aligned to its element size), then by
#: the library's own rank among dtypes of one width.
STORED_DTYPES: Mapping[str, torch.dtype] = {
    "I64": torch.int64,
    "F64": torch.float64,
    "F32": torch.float32,
    "I32": torch.int32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in STORED_DTYPES.items()}
_RANK = {dtype: rank for rank, dtype in enumerate(STORED_DTYPES.values())}


def write(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """``tensors`` (contiguous, on the CPU, dtypes of :data:`STORED_DTYPES`) and
    ``metadata`` as safetensors bytes, each tensor's bytes copied once."""
    ordered = sorted(tensors.items(), key=lambda item: (_RANK[item[1].dtype], item[0]))
    header: dict[str, Any] = {_METADATA: dict(metadata)}
    chunks = []
    offset = 0
    for name, tensor in ordered:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        # A flat byte view: numpy has no bfloat16, and 0-d tensors cannot change dtype.
        chunks.append(tensor.reshape(-1).view(torch.uint8).numpy())
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(HEADER_LENGTH_BYTES, "little"), text, *chunks])


def read_header(data: bytes) -> tuple[dict[str, Any], int]:
    """The JSON header of untrusted safetensors bytes and where the tensors' bytes start.

    Raises:
        FrameError: the bytes are too short for the header they announce, or the header
            is not a JSON object with unique keys.
    """
    if len(data) < HEADER_LENGTH_BYTES:
        raise FrameError(f"frame is truncated: {len(data)} bytes, the header length alone takes 8")
    size = int.from_bytes(data[:HEADER_LENGTH_BYTES], "little")
    if size > len(data) - HEADER_LENGTH_BYTES:
        raise FrameError(
            f"frame is truncated or garbage: header claims {size} bytes, "
            f"only {len(data) - HEADER_LENGTH_BYTES} follow"
        )
    start = HEADER_LENGTH_BYTES + size
    try:
        header = json.loads(
            data[HEADER_LENGTH_BYTES:start].decode("utf-8"), object_pairs_hook=_unique
        )
    except FrameError:
        raise
    except (ValueError, RecursionError) as e:
        raise FrameError(f"frame header is not valid JSON (garbage?): {e}") from e
    if not isinstance(header, dict):
        raise FrameError("frame header is not a JSON object (garbage?)")
    return header, start


def read_tensors(data: bytes, header: Mapping[str, Any], start: int) -> dict[str, torch.Tensor]:
    """The tensors that ``header`` (from :func:`read_header`) places in ``data[start:]``,
    in one writable copy of those bytes, in the order they are stored.

    Raises:
        FrameError: an entry that is not a dtype, shape and byte range that agree, or
            byte ranges that overlap, leave a gap or do not end where the data ends.
    """
    entries = sorted(
        ((_entry(name, entry), name) for name, entry in header.items() if name != _METADATA),
        key=lambda item: item[0][2],
    )
    available = len(data) - start
    end = 0
    for (_, _, begin, stop), name in entries:
        if begin != end:
            what = "overlaps the tensor before it" if begin < end else "leaves a gap before it"
            raise FrameError(f"frame tensor {name!r}: its bytes start at {begin}, which {what}")
        end = stop
    if end != available:
        if end > available:
            raise FrameError(
                f"frame is truncated: tensors need {end} bytes, {available} follow the header"
            )
        raise FrameError(f"frame holds {available - end} bytes after its last tensor")
    payload = bytearray(memoryview(data)[start:])  # tensors that own (and may change) it
    tensors: dict[str, torch.Tensor] = {}
    for (dtype, shape, begin, stop), name in entries:
        if begin == stop:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        raw = torch.frombuffer(payload, dtype=torch.uint8, count=stop - begin, offset=begin)
        if dtype == torch.bool and bool((raw > 1).any()):
            raise FrameError(f"frame tensor {name!r} is bool but holds bytes other than 0 and 1")
        if begin % dtype.itemsize:
            raw = raw.clone()  # another sender's layout: the view would be misaligned
        tensors[name] = raw.view(dtype).reshape(shape)
    return tensors


def unique_keys(message: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A ``json.loads`` ``object_pairs_hook`` that refuses a key given twice (JSON keeps the
    last one silently), with ``message`` formatted with ``key``."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise FrameError(message.format(key=key))
            result[key] = value
        return result

    return hook


_unique = unique_keys("frame header lists {key!r} twice")


def _entry(name: str, entry: object) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    if not isinstance(entry, dict) or entry.keys() != _ENTRY_KEYS:
        raise FrameError(
            f"frame tensor {name!r}: its header entry must hold exactly dtype, shape and "
            f"data_offsets, got {entry!r:.200}"
        )
    dtype = STORED_DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise FrameError(
            f"frame tensor {name!r}: stored dtype {entry['dtype']!r:.40} is not one of "
            f"{', '.join(STORED_DTYPES)}"
        )
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_natural(size) for size in shape):
        raise FrameError(f"frame tensor {name!r}: shape {shape!r:.80} is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_natural(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise FrameError(f"frame tensor {name!r}: data_offsets {offsets!r:.80} is not a range")
    begin, stop = offsets
    size = math.prod(shape) * dtype.itemsize
    if stop - begin != size:
        raise FrameError(
            f"frame tensor {name!r}: shape {shape} of {entry['dtype']} takes {size} bytes, "
            f"its range holds {stop - begin}"
        )
    return dtype, tuple(shape), begin, stop


def _natural(value: object) -> bool:
    # bool is an int subclass: true is not a size.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
