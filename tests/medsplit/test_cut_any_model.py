"""Cutting models MedSplit's authors did not pick: through torch.export where fx fails,
training-mode behaviour kept, numbers read from shapes recomputed, errors that say where.

Every table is checked against an independent count of the crossing tensors
(``crossing_count``: forward hooks and a dispatch mode, no trace), every split against
the model itself with ``torch.equal``. Sizes are small; no weights are downloaded.
"""

from __future__ import annotations

import copy

import pytest
import torch
from monai.networks.nets import UNet, ViT
from torch import nn

from medsplit.cutting import cut_table, split_model
from medsplit.cutting.trace import EXPORT, FX, trace_modes
from medsplit.errors import CutError
from medsplit.models import build_model, get_model_spec
from tests.medsplit.crossing_count import crossing_shapes


def _rows(rows):
    return {r.name: r for r in rows}


def _table_shapes(row):
    return sorted(((t.shape, t.dtype) for t in row.crossing), key=repr)


def _same_in_both_modes(model: nn.Module, split, x: torch.Tensor) -> None:
    """Split and model agree exactly in training and in evaluation mode, on one random
    stream, outputs and gradients and batch-norm statistics alike."""
    reference = copy.deepcopy(model)
    for training in (True, False):
        reference.train(training)
        for segment in split.segments:
            segment.train(training)
        torch.manual_seed(7)
        expected = reference(x)
        torch.manual_seed(7)
        got = split.forward(x)
        assert torch.equal(expected, got), f"outputs differ (training={training})"
        expected.square().sum().backward()
        got.square().sum().backward()
        theirs = {k: p for s in split.segments for k, p in s.named_parameters()}
        for name, p in reference.named_parameters():
            assert torch.equal(p.grad, theirs[name].grad), name
        buffers = {k: b for s in split.segments for k, b in s.named_buffers()}
        for name, b in reference.named_buffers():
            assert torch.equal(b, buffers[name]), name
        reference.zero_grad()
        for segment in split.segments:
            segment.zero_grad()


# --- fx and export agree where both work -------------------------------------------------


# The two smallest registry models, each with a skip or not; bench/check_tracers.py
# cross-checks all five at their default shapes.
@pytest.mark.parametrize("name", ["small_cnn", "skip_net"])
def test_registry_models_cut_alike_through_fx_and_export(name: str) -> None:
    spec = get_model_spec(name)
    model = build_model(name, seed=0)
    x = torch.randn(2, *spec.default_input_shape)
    assert cut_table(model, x, tracer=FX) == cut_table(model, x, tracer=EXPORT)
    by_fx = split_model(model, x, spec.default_cut_pair, tracer=FX)
    by_export = split_model(model, x, spec.default_cut_pair, tracer=EXPORT)
    assert by_fx.boundaries == by_export.boundaries
    assert [set(s.state_dict()) for s in by_export.segments] == [
        set(s.state_dict()) for s in by_fx.segments
    ]
    _same_in_both_modes(model, by_export, x)


# --- models fx cannot trace ------------------------------------------------------------


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return ViT(
        in_channels=1,
        img_size=(16, 16),
        patch_size=(8, 8),
        spatial_dims=2,
        classification=True,
        num_classes=2,
        hidden_size=16,
        mlp_dim=32,
        num_layers=2,
        num_heads=2,
        dropout_rate=0.1,
    )


def test_vit_is_cut_through_export_counting_what_crosses_and_keeping_dropout() -> None:
    model, x = _vit(), torch.randn(2, 1, 16, 16)
    rows = _rows(cut_table(model, x))
    assert {"patch_embedding", "blocks.0", "blocks.1"} <= set(rows)
    for cut in ("patch_embedding", "blocks.0"):
        assert _table_shapes(rows[cut]) == crossing_shapes(model.train(), x, cut), cut
    split = split_model(model, x, "blocks.0")
    # Every weight has one segment, the unused ones (norm_cross_attn) included.
    keys = [set(s.state_dict()) for s in split.segments]
    assert not keys[0] & keys[1] and keys[0] | keys[1] == set(model.state_dict())
    # ViT returns (logits, hidden states), and its dropout draws in training mode.
    reference = copy.deepcopy(model)
    for training in (True, False):
        reference.train(training)
        for segment in split.segments:
            segment.train(training)
        torch.manual_seed(3)
        expected = reference(x)
        torch.manual_seed(3)
        got = split.forward(x)
        assert torch.equal(expected[0], got[0])
        assert all(torch.equal(a, b) for a, b in zip(expected[1], got[1], strict=True))


def test_swin_unetr_is_cut_at_an_encoder_and_verifies_exactly() -> None:
    from monai.networks.nets import SwinUNETR

    torch.manual_seed(0)
    model = SwinUNETR(
        in_channels=1,
        out_channels=2,
        feature_size=12,
        spatial_dims=2,
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 1, 1),
        norm_name="batch",
    )
    x = torch.randn(2, 1, 32, 32)
    split = split_model(model, x, "encoder2")
    expected = crossing_shapes(model.train(), x, "encoder2")
    assert sorted(((t.shape, t.dtype) for t in split.boundaries[0]), key=repr) == expected
    _same_in_both_modes(model, split, x)


def test_efficientnet_keeps_drop_connect_in_training_mode() -> None:
    from monai.networks.nets import EfficientNetBN

    torch.manual_seed(0)
    model = EfficientNetBN(
        "efficientnet-b0", pretrained=False, spatial_dims=2, in_channels=1, num_classes=2
    ).train()
    x = torch.randn(2, 1, 32, 32)
    split = split_model(model, x, "_blocks.3")
    expected = crossing_shapes(model, x, "_blocks.3")
    assert sorted(((t.shape, t.dtype) for t in split.boundaries[0]), key=repr) == expected
    _same_in_both_modes(model, split, x)


# --- fx models: tables against the independent count ------------------------------------


def _unet() -> nn.Module:
    torch.manual_seed(0)
    return UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2))


@pytest.mark.parametrize(
    "cut",
    [
        "model.0",  # encoder, before any skip
        "model.1.submodule.0",  # encoder, the first skip crosses
        "model.1.submodule.1.submodule",  # the bottom
        "model.1.submodule.2",  # decoder
    ],
)
def test_unet_cuts_count_every_skip_connection(cut: str) -> None:
    model, x = _unet().train(), torch.randn(2, 1, 16, 16)
    (row,) = cut_table(model, x, candidates=[cut])
    assert _table_shapes(row) == crossing_shapes(model, x, cut)
    _same_in_both_modes(model, split_model(model, x, cut), x)


def test_densenet121_inside_a_dense_block_counts_every_crossing() -> None:
    model, x = build_model("densenet121", seed=0).train(), torch.randn(2, 1, 32, 32)
    cut = "features.denseblock1.denselayer3"
    (row,) = cut_table(model, x, candidates=[cut])
    assert _table_shapes(row) == crossing_shapes(model, x, cut)


# --- numbers read from shapes cross as recomputations --------------------------------------


class _BatchSizeAcross(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3)
        self.b = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        h = self.a(x)
        return self.b(h.reshape(n, -1))


@pytest.mark.parametrize("tracer", [FX, EXPORT])
def test_a_batch_size_read_before_the_cut_is_recomputed_after_it(tracer: str) -> None:
    model, x = _BatchSizeAcross(), torch.randn(2, 1, 8, 8)
    rows = cut_table(model, x, tracer=tracer)
    assert [r.name for r in rows] == ["a"]
    assert [t.name for t in rows[0].crossing] == ["a"]
    split = split_model(model, x, "a", tracer=tracer)
    bigger = torch.randn(5, 1, 8, 8)  # the far side reads the batch size off what crossed
    assert torch.equal(split.forward(bigger), model(bigger))


# --- training-mode behaviour a trace cannot keep is refused, by name --------------------


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # hidden Python state: a trace keeps one value of it
        return x * self.calls


class _CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.counter = _Counter()
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.counter(self.a(x)))


def test_hidden_state_the_segments_cannot_keep_is_refused_naming_the_module() -> None:
    with pytest.raises(CutError, match=r"module 'counter' \(_Counter\) differs first"):
        split_model(_CountsCalls(), torch.randn(2, 4), "a")


class _TrainingBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.training:  # frozen by a trace: each segment keeps one graph per mode
            h = nn.functional.dropout(h, 0.5, True) * 3
        return self.b(h)


def test_a_self_training_branch_is_kept_in_both_modes() -> None:
    model, x = _TrainingBranch(), torch.randn(4, 4)
    _same_in_both_modes(model, split_model(model, x, "a"), x)


# --- messages say where and what ------------------------------------------------------------


class _Chunks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3)
        self.b = nn.Conv2d(2, 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = list(self.a(x).chunk(2, 1))  # fx cannot iterate; export can
        return self.b(left) + self.b(right)


def test_fixed_size_iteration_fx_refuses_is_cut_through_export() -> None:
    model, x = _Chunks(), torch.randn(2, 1, 8, 8)
    assert trace_modes(model, (x,)).tracer == EXPORT
    _same_in_both_modes(model, split_model(model, x, "a"), x)


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: no fixed cut can follow it
            return x * 2
        return x


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.a(x))


def test_an_untraceable_model_is_refused_naming_module_line_and_construct() -> None:
    with pytest.raises(CutError) as e:
        split_model(_Outer(), torch.randn(2, 4), "a")
    message = str(e.value)
    assert "module 'inner' (_Inner)" in message
    assert "test_cut_any_model.py:" in message
    assert "data-dependent branch" in message
    assert "torch.where" in message


class _NeedsWiderInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x.shape) != 2 or x.shape[1] < 8:  # fx cannot take len(); the model refuses
            raise ValueError("needs at least 8 features")
        return self.a(x[:, :4])


def test_a_model_that_does_not_run_at_the_input_is_told_so_not_blamed_on_tracers() -> None:
    with pytest.raises(CutError, match=r"does not run on an input of shape \[2, 4\].*8 features"):
        split_model(_NeedsWiderInput(), torch.randn(2, 4), "a")
