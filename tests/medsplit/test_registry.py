"""The model registry: names, specs, validation, seeding, traceability, cut points."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import fx

from medsplit.cutting import split_model
from medsplit.data import synthetic_split
from medsplit.errors import ConfigError, UnknownModelError
from medsplit.models import ModelSpec, build_model, get_model_spec, model_names

#: The image models (the tests below read their cut facts off fx graphs of images).
NAMES = ["densenet121", "resnet18", "resnet34", "small_cnn", "skip_net"]
#: The model for a table of numeric features (a vertical job's tabular party).
TABULAR = ["tabular_mlp"]
#: The segmentation model (its output is a map of logits, not a row).
SEGMENTATION = ["unet"]


# --- helpers that read cut facts off a torch.fx graph (independent of medsplit.cutting) ---


def _in_scope(node: fx.Node, cut: str) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    scopes = {value[0] if isinstance(value, tuple) else key for key, value in stack.items()}
    if node.op == "call_module":
        scopes.add(str(node.target))
    return cut in scopes


def _cut_index(graph: fx.GraphModule, cut: str) -> int:
    """Index of the last node traced inside submodule ``cut``."""
    nodes = list(graph.graph.nodes)
    inside = [i for i, node in enumerate(nodes) if _in_scope(node, cut)]
    assert inside, f"no graph node belongs to {cut!r}"
    return inside[-1]


def _crossing(graph: fx.GraphModule, index: int) -> list[fx.Node]:
    """Values made at or before ``index`` and used after it: what crosses the cut."""
    nodes = list(graph.graph.nodes)
    later = set(nodes[index + 1 :])
    return [node for node in nodes[: index + 1] if any(user in later for user in node.users)]


def _param_count(graph: fx.GraphModule, start: int, stop: int) -> int:
    targets = {
        str(node.target)
        for node in list(graph.graph.nodes)[start:stop]
        if node.op in ("call_module", "get_attr")
    }
    total = 0
    for target in targets:
        try:
            owner = graph.get_submodule(target)
        except AttributeError:
            owner = None
        if owner is not None:
            total += sum(p.numel() for p in owner.parameters())
        else:
            total += graph.get_parameter(target).numel()
    return total


# --- names and specs ---


def test_model_names_are_the_documented_seven() -> None:
    assert model_names() == NAMES + TABULAR + SEGMENTATION


def test_the_tabular_model_takes_a_row_of_features_and_cuts_where_one_embedding_crosses() -> None:
    spec = get_model_spec("tabular_mlp")
    assert spec.default_input_shape == (16,)
    model = build_model("tabular_mlp", in_channels=7, num_classes=3, seed=0)
    assert model(torch.zeros(4, 7)).shape == (4, 3)
    # By default its input is its default shape's 16 columns.
    assert build_model("tabular_mlp", seed=0)(torch.zeros(2, 16)).shape == (2, 2)
    split = split_model(model, torch.zeros(2, 7), spec.default_cut_pair)
    assert [[t.shape for t in b] for b in split.boundaries] == [[(64,)], [(64,)]]


@pytest.mark.parametrize("name", NAMES)
def test_spec_fields_are_well_formed(name: str) -> None:
    spec = get_model_spec(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name
    assert spec.description and "\n" not in spec.description
    assert len(spec.default_input_shape) == 3
    assert all(isinstance(s, int) and s > 0 for s in spec.default_input_shape)
    assert len(spec.default_cut_pair) == 2
    assert spec.default_cuts(1) == (spec.default_cut,)
    assert spec.default_cuts(2) == spec.default_cut_pair
    with pytest.raises(ConfigError, match=rf"{name} has default cuts for 1 or 2 cuts, not 3"):
        spec.default_cuts(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "paper"), [("densenet121", "Huang"), ("resnet18", "He et"), ("resnet34", "He et")]
)
def test_descriptions_cite_the_paper(name: str, paper: str) -> None:
    assert paper in get_model_spec(name).description
    assert "2016" in get_model_spec(name).description or "2017" in get_model_spec(name).description


@pytest.mark.parametrize("bad", ["resnet50", "", "ResNet18", None, ["small_cnn"]])
def test_unknown_model_lists_the_known_ones(bad: object) -> None:
    with pytest.raises(UnknownModelError) as info:
        get_model_spec(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, LookupError)
    for name in NAMES:
        assert name in str(info.value)
    with pytest.raises(UnknownModelError):
        build_model(bad)  # type: ignore[arg-type]


# --- argument validation ---


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"spatial_dims": 1}, "spatial_dims"),
        ({"spatial_dims": 4}, "spatial_dims"),
        ({"spatial_dims": True}, "spatial_dims"),
        ({"spatial_dims": 2.0}, "spatial_dims"),
        ({"in_channels": 0}, "in_channels"),
        ({"in_channels": -3}, "in_channels"),
        ({"in_channels": "1"}, "in_channels"),
        ({"num_classes": 1}, "num_classes"),
        ({"num_classes": 0}, "num_classes"),
        ({"num_classes": True}, "num_classes"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "0"}, "seed"),
    ],
)
def test_bad_arguments_raise_config_error_naming_them(kwargs: dict, argument: str) -> None:
    with pytest.raises(ConfigError, match=argument):
        build_model("small_cnn", **kwargs)


def test_the_builders_check_arguments_themselves() -> None:
    from medsplit.models.skip_net import SkipNet
    from medsplit.models.small_cnn import small_cnn

    with pytest.raises(ConfigError, match="num_classes"):
        small_cnn(num_classes=1)
    with pytest.raises(ConfigError, match="spatial_dims"):
        SkipNet(spatial_dims=1)


# --- seeding ---


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_and_global_rng_untouched(name: str) -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    first = build_model(name, seed=7).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    second = build_model(name, seed=7).state_dict()
    other = build_model(name, seed=8).state_dict()
    assert torch.equal(torch.get_rng_state(), before)

    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert any(
        not torch.equal(first[key], other[key]) for key in first if first[key].is_floating_point()
    )


def test_unseeded_builds_draw_from_the_global_rng() -> None:
    a = build_model("small_cnn").state_dict()
    b = build_model("small_cnn").state_dict()
    assert not torch.equal(a["conv1.conv.weight"], b["conv1.conv.weight"])


# --- forward, backward, tracing ---


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_at_default_shape_reaches_every_parameter(name: str) -> None:
    spec = get_model_spec(name)
    model = build_model(name, seed=0)
    out = model(torch.rand(2, *spec.default_input_shape))
    assert out.shape == (2, 2)
    out.sum().backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, f"{pname} gets no gradient"
        assert torch.isfinite(param.grad).all(), pname


@pytest.mark.parametrize("name", NAMES)
def test_channels_and_classes_are_honoured(name: str) -> None:
    _, height, width = get_model_spec(name).default_input_shape
    model = build_model(name, in_channels=3, num_classes=5, seed=0).eval()
    with torch.no_grad():
        assert model(torch.rand(2, 3, height, width)).shape == (2, 5)


@pytest.mark.parametrize("name", NAMES)
def test_symbolic_trace_matches_the_module(name: str) -> None:
    spec = get_model_spec(name)
    model = build_model(name, seed=0).eval()
    graph = fx.symbolic_trace(model)
    x = torch.rand(2, *spec.default_input_shape)
    with torch.no_grad():
        assert torch.equal(graph(x), model(x))


@pytest.mark.parametrize("name", ["small_cnn", "skip_net"])
def test_small_models_run_on_tiny_volumes(name: str) -> None:
    model = build_model(name, spatial_dims=3, seed=0)
    out = model(torch.rand(2, 1, 8, 8, 8))
    assert out.shape == (2, 2)
    out.sum().backward()
    fx.symbolic_trace(model)


@pytest.mark.parametrize("name", ["small_cnn", "skip_net"])
@pytest.mark.parametrize("size", [(28, 28), (64, 64), (30, 30), (33, 17), (4, 4)])
def test_small_models_take_any_image_size(name: str, size: tuple[int, int]) -> None:
    model = build_model(name, seed=0)
    assert model(torch.rand(2, 1, *size)).shape == (2, 2)


@pytest.mark.parametrize(("name", "limit"), [("small_cnn", 50_000), ("skip_net", 200_000)])
def test_small_models_stay_small(name: str, limit: int) -> None:
    assert sum(p.numel() for p in build_model(name).parameters()) < limit


def test_small_cnn_learns_synthetic_images() -> None:
    train = synthetic_split(128, seed=0)
    test = synthetic_split(64, seed=1)
    model = build_model("small_cnn", seed=0)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        idx = torch.randint(len(train), (16,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(train.images[idx]), train.labels[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        accuracy = (model(test.images).argmax(1) == test.labels).float().mean().item()
    assert accuracy > 0.9


# --- cut points ---


@pytest.mark.parametrize("name", NAMES)
def test_default_cuts_name_submodules_and_keep_raw_input_home(name: str) -> None:
    spec = get_model_spec(name)
    model = build_model(name, seed=0)
    modules = dict(model.named_modules())
    graph = fx.symbolic_trace(model)
    for cut in (spec.default_cut, *spec.default_cut_pair):
        assert cut in modules, cut
        crossing = _crossing(graph, _cut_index(graph, cut))
        assert crossing, cut
        assert all(node.op != "placeholder" for node in crossing), f"raw input crosses {cut}"
    # The front of a vanilla cut has parameters, and so does the back.
    index = _cut_index(graph, spec.default_cut)
    assert _param_count(graph, 0, index + 1) > 0
    assert _param_count(graph, index + 1, len(graph.graph.nodes)) > 0


@pytest.mark.parametrize("name", NAMES)
def test_default_cut_pairs_leave_parameters_in_all_three_segments(name: str) -> None:
    cut1, cut2 = get_model_spec(name).default_cut_pair
    graph = fx.symbolic_trace(build_model(name, seed=0))
    first, second = _cut_index(graph, cut1), _cut_index(graph, cut2)
    assert first < second
    end = len(graph.graph.nodes)
    assert _param_count(graph, 0, first + 1) > 0, "front"
    assert _param_count(graph, first + 1, second + 1) > 0, "middle"
    assert _param_count(graph, second + 1, end) > 0, "head"


def test_param_count_helper_sees_everything() -> None:
    # Guards the helper the two tests above rely on: whole graph = whole model.
    model = build_model("skip_net", seed=0)
    graph = fx.symbolic_trace(model)
    total = sum(p.numel() for p in model.parameters())
    assert _param_count(graph, 0, len(graph.graph.nodes)) == total


@pytest.mark.parametrize(
    ("cut", "count"), [("stem", 1), ("block1", 2), ("block2", 2), ("block3", 1)]
)
def test_skip_net_long_skip_makes_two_tensors_cross(cut: str, count: int) -> None:
    graph = fx.symbolic_trace(build_model("skip_net", seed=0))
    crossing = _crossing(graph, _cut_index(graph, cut))
    assert len(crossing) == count, [node.name for node in crossing]
    if count == 2:
        # One of the two is the stem's output, carried over the cut for the skip.
        assert any(_in_scope(node, "stem") for node in crossing)
