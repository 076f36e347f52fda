"""The exported model, assembled from its segments, computes exactly what the split model does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hospital_agent.export import (
    ExportAssemblyError,
    ExportMetadata,
    assemble_state,
    build_assembled,
    check_same_outputs,
    load_export,
    write_export,
)
from medsplit.cutting.split import split_model
from medsplit.models.registry import build_model

CUTS = ["pool1", "pool2"]


def _meta() -> ExportMetadata:
    return ExportMetadata(
        model_name="small_cnn",
        model_args={"seed": 0},
        input_shape=[1, 28, 28],
        cut=CUTS,
        job_id=7,
        audit_head="0" * 64,
    )


def _parts() -> tuple[object, dict[str, dict[str, torch.Tensor]]]:
    model = build_model("small_cnn", seed=3).eval()
    split = split_model(model, torch.zeros(2, 1, 28, 28), CUTS)
    names = ("front", "middle", "head")
    return split, {n: s.state_dict() for n, s in zip(names, split.segments, strict=True)}


def test_assembled_model_equals_split_model_after_a_round_trip(tmp_path: Path) -> None:
    split, parts = _parts()
    state = assemble_state(parts)
    assembled = build_assembled(_meta(), state)
    batches = [
        torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(i)) for i in range(2)
    ]
    for segment in split.segments:
        segment.eval()
    check_same_outputs(assembled, split.forward, batches)
    loaded = load_export(write_export(tmp_path / "out", _meta(), state))
    with torch.no_grad():
        assert torch.equal(loaded(batches[0]), split.forward(batches[0]))


def test_a_changed_weight_refuses_the_export() -> None:
    split, parts = _parts()
    state = assemble_state(parts)
    name = next(iter(parts["head"]))
    state[name] = state[name] + 1.0
    for segment in split.segments:
        segment.eval()
    with pytest.raises(ExportAssemblyError, match="differs from the split model on test batch 0"):
        check_same_outputs(
            build_assembled(_meta(), state), split.forward, [torch.randn(2, 1, 28, 28)]
        )


def test_a_missing_part_and_a_doubly_claimed_tensor_are_named() -> None:
    _, parts = _parts()
    with pytest.raises(ExportAssemblyError, match="missing"):
        build_assembled(_meta(), assemble_state({"front": parts["front"]}))
    with pytest.raises(ExportAssemblyError, match="in both part 'front' and part 'again'"):
        assemble_state({"front": parts["front"], "again": parts["front"]})
