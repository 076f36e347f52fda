"""Assemble an exported model from its segments' weights and prove it unchanged.

The segments of a cut model keep the original model's parameter and buffer names
(:class:`medsplit.cutting.split.SplitModel`), so the full model is the union of their
state dicts loaded into a fresh build of the same registered model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from medsplit.errors import MedSplitError
from medsplit.models.registry import build_model


class ExportAssemblyError(MedSplitError):
    """The segments do not make the model they claim to, or it computes differently."""


@dataclass(frozen=True)
class ExportMetadata:
    """What the receiving hospital needs to rebuild and use the exported model."""

    model_name: str
    model_args: dict[str, object]
    input_shape: list[int]
    cut: list[str]
    job_id: int
    audit_head: str
    transforms: list[str] = field(default_factory=list)


def assemble_state(parts: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Merge segment state dicts, refusing a name two parts both claim."""
    merged: dict[str, torch.Tensor] = {}
    owner: dict[str, str] = {}
    for part, state in parts.items():
        for name, tensor in state.items():
            if name in merged:
                raise ExportAssemblyError(
                    f"tensor {name!r} is in both part {owner[name]!r} and part {part!r}"
                )
            merged[name] = tensor.detach().clone().contiguous()
            owner[name] = part
    return merged


def build_assembled(meta: ExportMetadata, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Build the registered model and load ``state`` into it strictly."""
    model = build_model(meta.model_name, **meta.model_args)  # type: ignore[arg-type]
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    if missing or unexpected:
        raise ExportAssemblyError(
            f"the parts do not make model {meta.model_name!r}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval()


def check_same_outputs(
    assembled: torch.nn.Module, split_forward: object, batches: Sequence[torch.Tensor]
) -> None:
    """Refuse the export unless the assembled model equals the split model exactly."""
    with torch.no_grad():
        for index, batch in enumerate(batches):
            want = split_forward(batch)  # type: ignore[operator]
            got = assembled(batch)
            if not torch.equal(want, got):
                raise ExportAssemblyError(
                    f"the assembled model differs from the split model on test batch {index}; "
                    "the export is refused"
                )


def write_export(out: Path, meta: ExportMetadata, state: Mapping[str, torch.Tensor]) -> Path:
    """Write ``model.safetensors`` and ``metadata.json`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(state), str(out / "model.safetensors"))
    (out / "metadata.json").write_text(json.dumps(asdict(meta), indent=2, sort_keys=True))
    return out


def load_export(out: Path) -> torch.nn.Module:
    """Rebuild an exported model from what :func:`write_export` wrote."""
    meta = ExportMetadata(**json.loads((out / "metadata.json").read_text()))
    return build_assembled(meta, load_file(str(out / "model.safetensors")))
