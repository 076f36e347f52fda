"""The cut table: rows computed by hand for two small networks, per-sample figures, forward
order, filtering of useless cuts, JSON rows, and every registry model's default cuts."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from medsplit.cutting import BoundaryTensor, CutInfo, candidate_cuts, cut_table, split_model
from medsplit.errors import CutError
from medsplit.models import build_model, get_model_spec, model_names

F32 = torch.float32


def _conv_flops(cin: int, cout: int, k: int, h_out: int, w_out: int) -> int:
    """2 FLOPs per multiply-add of a k x k convolution (bias and element-wise work uncounted)."""
    return 2 * cin * cout * k * k * h_out * w_out


def _row(
    name: str, params: int, total: int, flops: int, wire: str, shape: tuple[int, ...]
) -> CutInfo:
    numel = 1
    for d in shape:
        numel *= d
    return CutInfo(
        name=name,
        client_params=params,
        client_param_share=params / total,
        client_flops_per_sample=flops,
        crossing=(BoundaryTensor(wire, shape, F32),),
        values_per_sample=numel,
        bytes_per_sample=4 * numel,
    )


def _expected_small_cnn() -> list[CutInfo]:
    """small_cnn with 2 input channels at 20x20, counted by hand.

    conv1: 3x3 conv 2->16 (no bias) 288 weights, GroupNorm(4, 16) 32 -> 20x20, pool1 -> 10x10
    conv2: 16->32 4608, GroupNorm 64 -> 10x10, pool2 -> 5x5
    conv3: 32->64 18432, GroupNorm 128 -> 5x5, pool -> 1x1, flatten -> 64
    fc: 64*2 + 2 = 130 (on the server after any cut; a cut after fc leaves it nothing).
    Depth-2 names count (``conv1.conv``); ``conv1.adn`` ends where ``conv1`` does, and the
    shallower name is the one shown.
    """
    total = 288 + 32 + 4608 + 64 + 18432 + 128 + 130
    f1 = _conv_flops(2, 16, 3, 20, 20)
    f2 = f1 + _conv_flops(16, 32, 3, 10, 10)
    f3 = f2 + _conv_flops(32, 64, 3, 5, 5)
    p1, p2, p3 = 288 + 32, 288 + 32 + 4608 + 64, 288 + 32 + 4608 + 64 + 18432 + 128
    return [
        _row("conv1.conv", 288, total, f1, "conv1_conv", (16, 20, 20)),
        _row("conv1", p1, total, f1, "conv1", (16, 20, 20)),
        _row("pool1", p1, total, f1, "pool1", (16, 10, 10)),
        _row("conv2.conv", p1 + 4608, total, f2, "conv2_conv", (32, 10, 10)),
        _row("conv2", p2, total, f2, "conv2", (32, 10, 10)),
        _row("pool2", p2, total, f2, "pool2", (32, 5, 5)),
        _row("conv3.conv", p2 + 18432, total, f3, "conv3_conv", (64, 5, 5)),
        _row("conv3", p3, total, f3, "conv3", (64, 5, 5)),
        _row("pool", p3, total, f3, "pool", (64, 1, 1)),
        _row("flatten", p3, total, f3, "flatten", (64,)),
    ]


def _my_sequential() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),  # 0: 3*4*9 + 4 = 112 params, 8x8 out
        nn.ReLU(),  # 1
        nn.Conv2d(4, 8, 3, stride=2),  # 2: 4*8*9 + 8 = 296 params, 3x3 out
        nn.ReLU(),  # 3
        nn.Flatten(),  # 4: 72 values
        nn.Linear(72, 10),  # 5: 730 params
        nn.ReLU(),  # 6
        nn.Linear(10, 5),  # 7: 55 params, a cut after it leaves the server nothing
    )


def _expected_my_sequential() -> list[tuple[str, int, int, tuple[int, ...]]]:
    f0 = _conv_flops(3, 4, 3, 8, 8)
    f2 = f0 + _conv_flops(4, 8, 3, 3, 3)
    f5 = f2 + 2 * 72 * 10
    return [
        ("0", 112, f0, (4, 8, 8)),
        ("1", 112, f0, (4, 8, 8)),
        ("2", 408, f2, (8, 3, 3)),
        ("3", 408, f2, (8, 3, 3)),
        ("4", 408, f2, (72,)),
        ("5", 1138, f5, (10,)),
        ("6", 1138, f5, (10,)),
    ]


def test_small_cnn_rows_match_a_hand_count() -> None:
    model = build_model("small_cnn", in_channels=2, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 23682  # the hand count's total
    assert cut_table(model, torch.zeros(1, 2, 20, 20)) == _expected_small_cnn()


def test_own_sequential_rows_match_a_hand_count() -> None:
    model = _my_sequential()
    total = 112 + 296 + 730 + 55
    rows = cut_table(model, torch.zeros(1, 3, 8, 8))
    got = [(r.name, r.client_params, r.client_flops_per_sample, r.crossing[0].shape) for r in rows]
    assert got == _expected_my_sequential()
    for r in rows:
        assert r.client_param_share == r.client_params / total
        assert len(r.crossing) == 1
        (t,) = r.crossing
        # Sequential children are "0", "1", ...: crossing names must still be identifiers.
        assert t.name.isidentifier()
        assert t.dtype == F32
        assert r.values_per_sample == t.numel
        assert r.bytes_per_sample == 4 * t.numel


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: build_model("small_cnn", seed=0), (1, 28, 28)),
        (_my_sequential, (3, 8, 8)),
        (lambda: build_model("skip_net", seed=0), (1, 28, 28)),
    ],
    ids=["small_cnn", "sequential", "skip_net"],
)
def test_figures_are_per_sample(make, shape) -> None:
    model = make()
    one = cut_table(model, torch.zeros(1, *shape))
    four = cut_table(model, torch.randn(4, *shape))
    assert one == four
    assert one


def _completion_order(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """When each named submodule last finished its forward (hooks, independent of fx)."""
    order: dict[str, int] = {}
    counter = iter(range(10**9))
    handles = [
        m.register_forward_hook(lambda *_, name=name: order.__setitem__(name, next(counter)))
        for name, m in model.named_modules()
        if name
    ]
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        model.train()
        for h in handles:
            h.remove()
    return order


def _input_shape(name: str) -> tuple[int, ...]:
    # DenseNet121 at its default 64x64 is slow on two cores; 32x32 is the smallest it runs
    # on and has the same layers, so the same candidate cuts.
    return (1, 32, 32) if name == "densenet121" else get_model_spec(name).default_input_shape


@pytest.fixture(scope="module")
def registry_models() -> dict[str, nn.Module]:
    """Every registry model, built once for this file; tests must leave them as they are."""
    return {name: build_model(name, seed=0) for name in model_names()}


@pytest.fixture(scope="module")
def registry_tables(registry_models) -> dict[str, tuple[nn.Module, torch.Tensor, list[CutInfo]]]:
    tables = {}
    for name, model in registry_models.items():
        x = torch.zeros(1, *_input_shape(name))
        tables[name] = (model, x, cut_table(model, x))
    return tables


@pytest.mark.parametrize("name", model_names())
def test_registry_tables_are_in_forward_order_monotone_and_filtered(
    registry_tables, name: str
) -> None:
    model, x, rows = registry_tables[name]
    assert rows
    spec = get_model_spec(name)
    assert spec.default_cut in [r.name for r in rows]

    total = sum(p.numel() for p in model.parameters())
    shares = [r.client_param_share for r in rows]
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert shares == sorted(shares)
    assert [r.client_params for r in rows] == sorted(r.client_params for r in rows)
    flops = [r.client_flops_per_sample for r in rows]
    assert flops == sorted(flops)
    for r in rows:
        # No cut that leaves either side without weights.
        assert 0 < r.client_params < total, r.name
        assert r.client_param_share == r.client_params / total
        assert r.crossing
        assert r.values_per_sample == sum(t.numel for t in r.crossing)
        assert r.bytes_per_sample == sum(t.nbytes for t in r.crossing)

    order = _completion_order(model, x)
    positions = [order[r.name] for r in rows]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)


def test_rows_with_a_side_without_weights_are_left_out() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2), nn.Identity())
    rows = cut_table(model, torch.zeros(1, 4))
    # "0": no client weights; "3" and "4": no server weights.
    assert [r.name for r in rows] == ["1", "2"]


def test_explicit_candidates_are_priced_in_the_order_given() -> None:
    model = build_model("small_cnn", seed=0)
    x = torch.zeros(1, 1, 28, 28)
    everything = {r.name: r for r in cut_table(model, x)}
    rows = cut_table(model, x, candidates=["conv2", "pool1"])
    assert rows == [everything["conv2"], everything["pool1"]]


@pytest.mark.parametrize(
    ("candidates", "pattern"),
    [
        (["pool1", "no_such_layer"], r"'no_such_layer' is not a submodule"),
        (["conv1.adn.Z"], r"'conv1\.adn\.Z' is not a submodule"),
    ],
)
def test_explicit_invalid_candidate_raises(candidates: list[str], pattern: str) -> None:
    model = build_model("small_cnn", seed=0)
    with pytest.raises(CutError, match=pattern):
        cut_table(model, torch.zeros(1, 1, 28, 28), candidates=candidates)


def test_explicit_candidate_that_cannot_be_cut_raises() -> None:
    class InputLate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x)) + x

    with pytest.raises(CutError, match="raw data would leave"):
        cut_table(InputLate(), torch.zeros(1, 4), candidates=["a"])
    assert cut_table(InputLate(), torch.zeros(1, 4)) == []  # and no candidate by default


def test_to_json_rows() -> None:
    model = build_model("skip_net", seed=0)
    rows = cut_table(model, torch.zeros(1, 1, 28, 28))
    data = json.loads(json.dumps([r.to_json() for r in rows]))
    assert len(data) == len(rows)
    for r, d in zip(rows, data, strict=True):
        assert set(d) == {
            "name",
            "client_params",
            "client_param_share",
            "client_flops_per_sample",
            "crossing",
            "values_per_sample",
            "bytes_per_sample",
        }
        assert d["name"] == r.name
        assert d["client_params"] == r.client_params
        assert d["client_param_share"] == r.client_param_share
        assert d["client_flops_per_sample"] == r.client_flops_per_sample
        assert d["values_per_sample"] == r.values_per_sample
        assert d["bytes_per_sample"] == r.bytes_per_sample
        assert d["crossing"] == [
            {"name": t.name, "shape": list(t.shape), "dtype": "float32"} for t in r.crossing
        ]
    block1 = next(d for d in data if d["name"] == "block1")
    assert block1["crossing"] == [
        {"name": "stem", "shape": [16, 14, 14], "dtype": "float32"},
        {"name": "block1", "shape": [32, 7, 7], "dtype": "float32"},
    ]


def test_cut_table_leaves_the_model_untouched() -> None:
    model = build_model("resnet18", seed=0)
    model.layer1.eval()
    flags = {n: m.training for n, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cut_table(model, torch.randn(2, 1, 28, 28))
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", model_names())
def test_default_cut_pair_split_into_three_segments(registry_models, name: str) -> None:
    spec = get_model_spec(name)
    model = registry_models[name]
    x = torch.randn(2, *_input_shape(name))
    split = split_model(model, x, spec.default_cut_pair)
    assert len(split.segments) == 3
    assert split.cuts == spec.default_cut_pair
    for segment in split.segments:
        assert sum(p.numel() for p in segment.parameters()) > 0
    model.eval()
    for segment in split.segments:
        segment.eval()
    try:
        with torch.no_grad():
            assert torch.equal(split.forward(x), model(x))
    finally:
        model.train()


def test_candidate_cuts_accepts_a_plain_module() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert candidate_cuts(model) == ["0", "1", "2"]
