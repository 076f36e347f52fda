"""Sample frame metadata shared by the frame tests."""

from __future__ import annotations

import json

from medsplit.wire.frame import FORMAT_KEY, FORMAT_VERSION


def frame_metadata(dtypes: dict[str, str] | None = None, **changes: str) -> dict[str, str]:
    """Metadata of a valid frame whose tensors have ``dtypes`` (default: float32 ``x``)."""
    metadata = {
        FORMAT_KEY: FORMAT_VERSION,
        "job": "j",
        "round": "0",
        "position": "0",
        "step": "0",
        "kind": "activations",
        "mode": "vanilla",
        "codec": "none",
        "tensors": json.dumps(dtypes if dtypes is not None else {"x": "float32"}),
    }
    metadata.update(changes)
    return metadata
