"""The tensor wire format: frames of named tensors as safetensors bytes, and their codecs."""

from medsplit.wire.codecs import (
    CODECS,
    RESERVED_PREFIX,
    Bf16Codec,
    Codec,
    Fp16Codec,
    Int8Codec,
    NoneCodec,
    get_codec,
)
from medsplit.wire.frame import (
    ALLOWED_DTYPES,
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    FrameKind,
    FrameMeta,
    FrameSpec,
    TensorSpec,
    check_frame,
    decode_frame,
    encode_frame,
    raw_tensor_bytes,
)

__all__ = [
    "ALLOWED_DTYPES",
    "CODECS",
    "DEFAULT_MAX_FRAME_BYTES",
    "RESERVED_PREFIX",
    "Bf16Codec",
    "Codec",
    "Fp16Codec",
    "Frame",
    "FrameKind",
    "FrameMeta",
    "FrameSpec",
    "Int8Codec",
    "NoneCodec",
    "TensorSpec",
    "check_frame",
    "decode_frame",
    "encode_frame",
    "get_codec",
    "raw_tensor_bytes",
]
