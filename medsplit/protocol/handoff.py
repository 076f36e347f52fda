"""A hospital's training state as safetensors bytes, for the next hospital to continue from.

The bytes hold only tensors and JSON strings: loading them runs no code (no pickle).
Encryption for the recipient is added on top by the hospital agent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from medsplit.errors import HandoffError
from medsplit.protocol.party import Party

HANDOFF_FORMAT = "medsplit.handoff"
HANDOFF_VERSION = "1"
NOTE = "note:"


def export_parties(
    parties: Mapping[str, Party], *, notes: Mapping[str, str] | None = None
) -> bytes:
    """Serialise the parties a hospital holds (``front``, and ``head`` in U-shaped mode).

    ``notes`` are kept as text beside them, under ``note:<name>`` (a snapshot keeps the
    turn's losses so far there); :func:`read_notes` gives them back.
    """
    tensors: dict = {}
    metadata = {
        "format": HANDOFF_FORMAT,
        "version": HANDOFF_VERSION,
        "parties": json.dumps(sorted(parties)),
        **{f"{NOTE}{name}": text for name, text in (notes or {}).items()},
    }
    for name, party in parties.items():
        t, m = party.export_state(f"{name}:")
        tensors.update(t)
        metadata.update(m)
    return save_safetensors(tensors, metadata=metadata)


def import_parties(data: bytes, parties: Mapping[str, Party]) -> None:
    """Load what :func:`export_parties` wrote into ``parties``; all or nothing.

    Raises:
        HandoffError: the bytes are not a hand-off or do not fit these parties.
    """
    try:
        tensors = load_safetensors(bytes(data))
        metadata = read_safetensors_metadata(data)
    except (SafetensorError, ValueError, TypeError) as e:
        raise HandoffError(f"hand-off is not valid safetensors bytes: {e}") from e
    if metadata.get("format") != HANDOFF_FORMAT or metadata.get("version") != HANDOFF_VERSION:
        raise HandoffError(
            f"hand-off format is {metadata.get('format')!r} version "
            f"{metadata.get('version')!r}, expected {HANDOFF_FORMAT!r} version {HANDOFF_VERSION}"
        )
    if metadata.get("parties") != json.dumps(sorted(parties)):
        raise HandoffError(
            f"hand-off holds parties {metadata.get('parties')}, expected {sorted(parties)}"
        )
    appliers = [
        party.prepare_import(tensors, metadata, f"{name}:") for name, party in parties.items()
    ]
    for apply in appliers:
        apply()


def read_notes(data: bytes) -> dict[str, str]:
    """The notes :func:`export_parties` kept beside the parties (none: ``{}``)."""
    try:
        metadata = read_safetensors_metadata(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return {k[len(NOTE) :]: v for k, v in metadata.items() if k.startswith(NOTE)}


def read_safetensors_metadata(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (after ``safetensors`` validated them).

    ``safetensors`` loads tensors from bytes but offers no reader for the metadata of
    in-memory bytes, hence this: an 8-byte little-endian length, then a JSON header.
    """
    length = int.from_bytes(bytes(data[:8]), "little")
    header = json.loads(bytes(data[8 : 8 + length]))
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("safetensors metadata is not an object")
    return metadata
