"""Frames: the tensors that cross a cut, with the ids that say where they belong.

A frame is one safetensors blob (never pickle, so no code runs on the receiver). Its
text metadata carries a format marker and version, the :class:`FrameMeta` fields, and a
JSON map from each tensor name to its original dtype; the codec named in the metadata
says how each floating tensor is stored (see :mod:`medsplit.wire.codecs`).

Everything that comes off the wire is untrusted: :func:`decode_frame` raises
:class:`~medsplit.errors.FrameError`, and nothing else, for any input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import torch

from medsplit.errors import CodecError, FrameError
from medsplit.wire import layout
from medsplit.wire.codecs import (
    CODECS,
    DATA_PART,
    RESERVED_PREFIX,
    Codec,
    get_codec,
    part_key,
)

__all__ = [
    "ALLOWED_DTYPES",
    "DEFAULT_MAX_FRAME_BYTES",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "MODE_NAME_RE",
    "Frame",
    "FrameKind",
    "FrameMeta",
    "FrameSpec",
    "TensorSpec",
    "check_frame",
    "decode_frame",
    "encode_frame",
    "raw_tensor_bytes",
]

DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024

#: Metadata key of the format marker, and the only version this code reads and writes.
#: Version 2 names the hospital's place in its round ``position`` (version 1 called the
#: same number ``turn``); a frame of another version is refused, naming both versions.
FORMAT_KEY = "medsplit.frame"
FORMAT_VERSION = "2"

_ID_FIELDS = ("round", "position", "step")
_TENSORS_KEY = "tensors"
_META_KEYS = frozenset({FORMAT_KEY, "job", *_ID_FIELDS, "kind", "mode", "codec", _TENSORS_KEY})

_JOB_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: What a mode's name may be, on the wire and in the coordinator's database (16
#: characters). Which modes exist is the mode registry's business (``medsplit.modes``);
#: the wire sits below it, and the receiver's roles never read the field.
MODE_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,15}")
# Ids are written as plain decimal; a sign is accepted only to say "negative" clearly.
_INT_RE = re.compile(r"-?[0-9]{1,20}")
# Ids must fit a signed 64-bit database column.
_MAX_ID = 2**63 - 1

#: dtypes a frame may carry, by the name used in frame metadata.
ALLOWED_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        str(dtype).removeprefix("torch."): dtype
        for dtype in (
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.bool,
        )
    }
)
_DTYPE_NAMES = {dtype: name for name, dtype in ALLOWED_DTYPES.items()}
_NONE_CODEC = CODECS["none"]


class FrameKind(StrEnum):
    """What a frame carries: which tensors cross which way at a cut."""

    ACTIVATIONS = "activations"
    GRADIENTS = "gradients"
    HEAD_ACTIVATIONS = "head_activations"
    HEAD_GRADIENTS = "head_gradients"
    # Validation at the end of a turn: the server's segment forward only, nothing learnt.
    EVAL_ACTIVATIONS = "eval_activations"
    EVAL_OUTPUTS = "eval_outputs"
    # Turn control (``medsplit.turns.control``): scalars only, never data.
    SYNC = "sync"
    REJOIN = "rejoin"
    RESUME = "resume"
    METRICS = "metrics"
    DONE = "done"
    PAUSED = "paused"
    STOPPED = "stopped"


def _coerce_enum(enum: type[StrEnum], value: object, what: str) -> Any:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    known = ", ".join(member.value for member in enum)
    raise FrameError(f"unknown {what} {value!r}; known: {known}")


@dataclass(frozen=True)
class FrameMeta:
    """Where a frame belongs: job, round, the hospital's position and step, what it
    carries, how it is coded.

    Args:
        job: the job id, 1 to 128 characters of ``[A-Za-z0-9_.:-]``.
        round: round number, an int in ``[0, 2**63)``.
        position: the hospital's position in the round (its turn's place, not a count
            of turns in the job), same range.
        step: step number within the turn, same range.
        kind: a :class:`FrameKind` or its value.
        mode: the mode's name (:data:`MODE_NAME_RE`; the registry is
            :mod:`medsplit.modes`).
        codec: a name in :data:`~medsplit.wire.codecs.CODECS`.

    Raises:
        FrameError: naming the field that is invalid.
    """

    job: str
    round: int
    position: int
    step: int
    kind: FrameKind
    mode: str
    codec: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or _JOB_RE.fullmatch(self.job) is None:
            raise FrameError(
                f"job must be 1 to 128 characters of [A-Za-z0-9_.:-], got {self.job!r}"
            )
        for name in _ID_FIELDS:
            value = getattr(self, name)
            # bool is an int subclass; True as a step number is a bug, not a 1.
            if not isinstance(value, int) or isinstance(value, bool):
                raise FrameError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise FrameError(f"{name} must not be negative, got {value}")
            if value > _MAX_ID:
                raise FrameError(f"{name} must be below 2**63, got {value}")
        # Frozen: coerced values are set through object.__setattr__.
        object.__setattr__(self, "kind", _coerce_enum(FrameKind, self.kind, "frame kind"))
        if not isinstance(self.mode, str) or MODE_NAME_RE.fullmatch(self.mode) is None:
            raise FrameError(
                "mode must be a mode name, 1 to 16 characters of [a-z0-9_] starting with a "
                f"letter, got {self.mode!r}"
            )
        # A str subclass (an enum member) is stored as the plain name it stands for.
        object.__setattr__(self, "mode", str.__str__(self.mode))
        get_codec(self.codec)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise FrameError(f"tensor names must be non-empty strings, got {name!r}")
    if name.startswith(RESERVED_PREFIX):
        raise FrameError(
            f"tensor name {name!r} starts with {RESERVED_PREFIX!r}, which is reserved "
            "for codec parts; rename the tensor"
        )


@dataclass(frozen=True, eq=False)
class Frame:
    """One message across a cut: its :class:`FrameMeta` and its named tensors.

    ``tensors`` is copied into a read-only mapping, keeping the caller's order.
    Frames compare by identity (tensors have no single truth value).

    Raises:
        FrameError: if ``meta`` is not a FrameMeta or a name or value is invalid.
    """

    meta: FrameMeta
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, FrameMeta):
            raise FrameError(f"meta must be a FrameMeta, got {type(self.meta).__name__}")
        if not isinstance(self.tensors, Mapping):
            raise FrameError(f"tensors must be a mapping, got {type(self.tensors).__name__}")
        for name, value in self.tensors.items():
            _check_name(name)
            if not isinstance(value, torch.Tensor):
                raise FrameError(f"tensor {name!r} is a {type(value).__name__}, not a Tensor")
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype a received tensor must have.

    Args:
        shape: one entry per dimension: an exact size, or ``None`` for any size (the batch).
        dtype: the exact dtype.
    """

    shape: tuple[int | None, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        for size in shape:
            if size is not None and (not isinstance(size, int) or size < 0):
                raise ValueError(f"shape entries must be ints >= 0 or None, got {self.shape!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        object.__setattr__(self, "shape", shape)

    def matches(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of ``shape`` fits this spec's shape."""
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape, strict=True)
        )


@dataclass(frozen=True)
class FrameSpec:
    """What the receiver expects; ``None`` leaves that part unchecked.

    Args:
        kind: the expected :class:`FrameKind`.
        tensors: the exact set of tensor names, each with its :class:`TensorSpec`.
        optional: names in ``tensors`` that may be absent (a gradient that no path
            reached is not sent); when present they must still match their spec.
    """

    kind: FrameKind | None = None
    tensors: Mapping[str, TensorSpec] | None = None
    optional: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.kind is not None:
            try:
                object.__setattr__(self, "kind", FrameKind(self.kind))
            except ValueError:
                raise ValueError(f"unknown frame kind {self.kind!r}") from None
        if self.tensors is not None:
            for name, spec in self.tensors.items():
                if not isinstance(spec, TensorSpec):
                    raise ValueError(f"spec for {name!r} must be a TensorSpec, got {spec!r}")
            object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        optional = frozenset(self.optional)
        if optional and (self.tensors is None or not optional <= set(self.tensors)):
            raise ValueError(f"optional names {sorted(optional)} must all be in tensors")
        object.__setattr__(self, "optional", optional)


def raw_tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Sum of ``numel * element_size`` over ``tensors``: the payload without any framing."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _codec_for(codec: Codec, dtype: torch.dtype) -> Codec:
    return codec if codec.applies_to(dtype) else _NONE_CODEC


# --------------------------------------------------------------------------- encoding


def _prepare(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.layout != torch.strided:
        raise CodecError(
            f"tensor {name!r}: layout {tensor.layout} is not supported; use a dense one"
        )
    if tensor.dtype not in _DTYPE_NAMES:
        raise CodecError(
            f"tensor {name!r}: dtype {tensor.dtype} cannot cross the wire; "
            f"allowed: {', '.join(ALLOWED_DTYPES)}"
        )
    try:
        # detach: autograd history never crosses; .to/.contiguous return new tensors
        # when they must, so the caller's tensor is left as it is.
        return tensor.detach().to("cpu").contiguous()
    except (RuntimeError, NotImplementedError) as e:
        raise CodecError(f"tensor {name!r}: cannot move it to CPU: {e}") from e


def encode_frame(frame: Frame, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Encode a frame as safetensors bytes.

    Args:
        frame: the frame; tensors may be on any device, non-contiguous or need grad.
        max_bytes: refuse to produce more bytes than this.

    Returns:
        The bytes to send.

    Raises:
        CodecError: a tensor cannot be encoded (dtype, layout, codec limits such as
            fp16 overflow) or the frame would exceed ``max_bytes``.
    """
    if not isinstance(frame, Frame):
        raise CodecError(f"expected a Frame, got {type(frame).__name__}")
    codec = get_codec(frame.meta.codec)
    stored: dict[str, torch.Tensor] = {}
    dtypes: dict[str, str] = {}
    for name, tensor in frame.tensors.items():
        prepared = _prepare(name, tensor)
        dtypes[name] = _DTYPE_NAMES[prepared.dtype]
        parts = _codec_for(codec, prepared.dtype).encode(name, prepared)
        for part, value in parts.items():
            stored[part_key(name, part)] = value.contiguous()
    size = raw_tensor_bytes(stored)
    if size > max_bytes:
        raise CodecError(f"frame holds {size} bytes of tensors, more than max_bytes={max_bytes}")
    meta = frame.meta
    metadata = {
        FORMAT_KEY: FORMAT_VERSION,
        "job": meta.job,
        "round": str(meta.round),
        "position": str(meta.position),
        "step": str(meta.step),
        "kind": meta.kind.value,
        "mode": meta.mode,
        "codec": meta.codec,
        _TENSORS_KEY: json.dumps(dtypes, separators=(",", ":")),
    }
    data = layout.write(stored, metadata)
    if len(data) > max_bytes:
        raise CodecError(f"encoded frame is {len(data)} bytes, more than max_bytes={max_bytes}")
    return data


# --------------------------------------------------------------------------- decoding


def _as_bytes(data: object, max_bytes: int) -> bytes:
    if isinstance(data, memoryview):
        size = data.nbytes
    elif isinstance(data, bytes | bytearray):
        size = len(data)
    else:
        raise FrameError(f"frame must be bytes, bytearray or memoryview, got {type(data).__name__}")
    if size == 0:
        raise FrameError("frame is empty")
    # Checked before anything is parsed or copied.
    if size > max_bytes:
        raise FrameError(f"frame is oversized: {size} bytes, more than max_bytes={max_bytes}")
    # Read as immutable bytes (what the relay hands over: no copy); bounded by max_bytes.
    return data.tobytes() if isinstance(data, memoryview) else bytes(data)


def _read_metadata(header: Mapping[str, Any]) -> dict[str, str]:
    metadata = header.get("__metadata__")
    if metadata is None:
        raise FrameError(f"not a MedSplit frame: no metadata (missing {FORMAT_KEY!r} marker)")
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise FrameError("frame metadata must map strings to strings")
    return metadata


def _parse_id(metadata: Mapping[str, str], name: str) -> int:
    text = metadata[name]
    if _INT_RE.fullmatch(text) is None:
        raise FrameError(f"metadata field {name!r} is not an integer: {text!r}")
    return int(text)


_reject_duplicates = layout.unique_keys("tensor {key!r} is listed twice in frame metadata")


def _read_meta(metadata: Mapping[str, str]) -> tuple[FrameMeta, dict[str, torch.dtype]]:
    version = metadata.get(FORMAT_KEY)
    if version is None:
        raise FrameError(f"not a MedSplit frame: metadata has no {FORMAT_KEY!r} marker")
    if version != FORMAT_VERSION:
        raise FrameError(
            f"unsupported frame format version {version!r}; this code reads {FORMAT_VERSION!r} "
            "only: the sender runs another MedSplit release, upgrade both sides to the same one"
        )
    missing = sorted(_META_KEYS - metadata.keys())
    if missing:
        raise FrameError(f"frame metadata lacks field(s): {', '.join(missing)}")
    unknown = sorted(metadata.keys() - _META_KEYS)
    if unknown:
        raise FrameError(f"frame metadata has unknown field(s): {', '.join(map(repr, unknown))}")
    meta = FrameMeta(
        job=metadata["job"],
        round=_parse_id(metadata, "round"),
        position=_parse_id(metadata, "position"),
        step=_parse_id(metadata, "step"),
        kind=metadata["kind"],  # type: ignore[arg-type]  # FrameMeta coerces and checks
        mode=metadata["mode"],  # FrameMeta checks the name
        codec=metadata["codec"],
    )
    try:
        listing = json.loads(metadata[_TENSORS_KEY], object_pairs_hook=_reject_duplicates)
    except (ValueError, RecursionError) as e:
        if isinstance(e, FrameError):
            raise
        raise FrameError(f"metadata field 'tensors' is not valid JSON: {e}") from e
    if not isinstance(listing, dict):
        raise FrameError("metadata field 'tensors' must be a JSON object of name -> dtype")
    dtypes: dict[str, torch.dtype] = {}
    for name, dtype_name in listing.items():
        _check_name(name)
        dtype = ALLOWED_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise FrameError(
                f"tensor {name!r} declares dtype {dtype_name!r}, which is not allowed; "
                f"allowed: {', '.join(ALLOWED_DTYPES)}"
            )
        dtypes[name] = dtype
    return meta, dtypes


def _decode_tensors(
    codec: Codec, dtypes: Mapping[str, torch.dtype], stored: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name, dtype in dtypes.items():
        tensor_codec = _codec_for(codec, dtype)
        parts: dict[str, torch.Tensor] = {}
        for part in tensor_codec.parts:
            key = part_key(name, part)
            value = stored.pop(key, None)
            if value is None:
                what = "its data" if part == DATA_PART else f"part {part!r} ({key!r})"
                raise FrameError(f"tensor {name!r} (codec {tensor_codec.name!r}) is missing {what}")
            parts[part] = value
        try:
            tensors[name] = tensor_codec.decode(name, parts, dtype)
        except FrameError:
            raise
        except Exception as e:
            raise FrameError(f"decoding tensor {name!r}: {type(e).__name__}: {e}") from e
    if stored:
        raise FrameError(
            f"frame holds tensor(s) not listed in its metadata: {', '.join(map(repr, stored))}"
        )
    return tensors


def _check_kind(kind: FrameKind, spec: FrameSpec) -> None:
    if spec.kind is not None and kind != spec.kind:
        raise FrameError(f"expected a {spec.kind.value!r} frame, got {kind.value!r}")


def _check_tensors(tensors: Mapping[str, torch.Tensor], spec: FrameSpec) -> None:
    if spec.tensors is None:
        return
    missing = [n for n in spec.tensors if n not in tensors and n not in spec.optional]
    extra = [name for name in tensors if name not in spec.tensors]
    if missing or extra:
        raise FrameError(
            f"frame tensors do not match: missing {missing or 'none'}, unexpected {extra or 'none'}"
        )
    for name, want in spec.tensors.items():
        got = tensors.get(name)
        if got is None:
            continue
        if got.dtype != want.dtype:
            raise FrameError(f"tensor {name!r}: expected dtype {want.dtype}, got {got.dtype}")
        if not want.matches(tuple(got.shape)):
            shape = tuple("*" if size is None else size for size in want.shape)
            raise FrameError(
                f"tensor {name!r}: expected shape {shape} (* = any), got {tuple(got.shape)}"
            )


def check_frame(frame: Frame, spec: FrameSpec) -> None:
    """Check an already decoded frame against ``spec`` (for receivers that first look at
    the kind to know which spec applies).

    Raises:
        FrameError: the kind or the tensors do not match, saying how.
    """
    _check_kind(frame.meta.kind, spec)
    _check_tensors(frame.tensors, spec)


def decode_frame(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    expect: FrameSpec | None = None,
) -> Frame:
    """Decode bytes from another party into a :class:`Frame`.

    Args:
        data: the received bytes (untrusted).
        max_bytes: refuse larger inputs before looking inside them.
        expect: when given, the frame's kind and tensors must match it.

    Returns:
        The frame, each tensor in its original dtype, in the sender's order.

    Raises:
        FrameError: for anything wrong with ``data``, saying what; no other exception
            escapes for any input.
    """
    raw = _as_bytes(data, max_bytes)
    header, start = layout.read_header(raw)
    meta, dtypes = _read_meta(_read_metadata(header))
    if expect is not None:
        # Before the tensors are copied out: a wrong kind is cheap to reject.
        _check_kind(meta.kind, expect)
    tensors = _decode_tensors(
        get_codec(meta.codec), dtypes, layout.read_tensors(raw, header, start)
    )
    if expect is not None:
        _check_tensors(tensors, expect)
    return Frame(meta=meta, tensors=tensors)
