"""Cutting a model: the user's model is untouched, names are kept, segments compute exactly
what the model computes (outputs and gradients), boundaries are described truthfully, and
cuts that cannot be honoured are refused with a message that names the problem."""

from __future__ import annotations

import copy
import gc
import keyword
import weakref

import pytest
import torch
from torch import nn

from medsplit.cutting import BoundaryTensor, SplitModel, split_model
from medsplit.errors import CutError
from medsplit.models import build_model

# --- helpers, independent of medsplit.cutting ---------------------------------------------


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)
    ).double()


def _outputs_of(model: nn.Module, x: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Each named submodule's output on ``x`` (eval mode, no grad), read with forward hooks."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        model.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out.detach().clone())
        )
        for name in names
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return seen


def _set_mode(split: SplitModel, training: bool) -> None:
    for segment in split.segments:
        segment.train(training)


def _loss(out: torch.Tensor) -> torch.Tensor:
    # Weighted so that every output element gets a different, non-trivial gradient.
    weights = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    return (out * weights).sum()


def _split_params(split: SplitModel) -> dict[str, nn.Parameter]:
    params: dict[str, nn.Parameter] = {}
    for segment in split.segments:
        for name, p in segment.named_parameters():
            assert name not in params, f"{name} is in two segments"
            params[name] = p
    return params


# --- the cases: (model factory, input factory, cuts, per-cut crossing module names) -------

CASES = {
    "mlp-seq": (_mlp, lambda: torch.randn(4, 6, dtype=torch.float64), ("1",), [["1"]]),
    "mlp-seq-ushaped": (
        _mlp,
        lambda: torch.randn(4, 6, dtype=torch.float64),
        ("1", "3"),
        [["1"], ["3"]],
    ),
    "densenet121-denseblock1": (
        lambda: build_model("densenet121", seed=0),
        lambda: torch.randn(2, 1, 32, 32),
        ("features.denseblock1",),
        [["features.denseblock1"]],
    ),
    "resnet18-layer1": (
        lambda: build_model("resnet18", seed=0),
        lambda: torch.randn(2, 1, 28, 28),
        ("layer1",),
        [["layer1"]],
    ),
    "resnet18-layer2.0": (
        lambda: build_model("resnet18", seed=0),
        lambda: torch.randn(2, 1, 28, 28),
        ("layer2.0",),
        [["layer2.0"]],
    ),
    "resnet18-ushaped": (
        lambda: build_model("resnet18", seed=0),
        lambda: torch.randn(2, 1, 28, 28),
        ("layer1", "layer4"),
        [["layer1"], ["layer4"]],
    ),
    "skip_net-block1": (
        lambda: build_model("skip_net", seed=0),
        lambda: torch.randn(2, 1, 28, 28),
        ("block1",),
        [["stem", "block1"]],
    ),
    "skip_net-ushaped": (
        lambda: build_model("skip_net", seed=0),
        lambda: torch.randn(2, 1, 28, 28),
        ("block1", "block3"),
        [["stem", "block1"], ["block3"]],
    ),
    "small_cnn-ushaped": (
        lambda: build_model("small_cnn", seed=0),
        lambda: torch.randn(3, 1, 28, 28),
        ("pool1", "pool"),
        [["pool1"], ["pool"]],
    ),
}


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """One model and input per case, built once; tests work on deep copies."""
    torch.manual_seed(1)
    return {
        key: (make_model(), make_input()) for key, (make_model, make_input, *_) in CASES.items()
    }


# --- the user's model is untouched ---------------------------------------------------------


def test_split_leaves_the_model_untouched_and_shares_no_storage() -> None:
    model = build_model("resnet18", seed=0)
    model.train()
    model.layer2.eval()  # a mixed pattern of flags must survive as it is
    flags = {name: m.training for name, m in model.named_modules()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model_ptrs = {v.untyped_storage().data_ptr() for v in model.state_dict().values()}
    x = torch.randn(2, 1, 28, 28)

    split = split_model(model, x, "layer1")

    assert {name: m.training for name, m in model.named_modules()} == flags
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    for segment in split.segments:
        for name, tensor in segment.state_dict().items():
            assert tensor.untyped_storage().data_ptr() not in model_ptrs, name

    # Training the segments (an SGD step, and batch-norm statistics in train mode) does
    # not reach the model.
    _set_mode(split, True)
    params = list(_split_params(split).values())
    optimizer = torch.optim.SGD(params, lr=0.5)
    _loss(split.forward(x)).backward()
    optimizer.step()
    assert not all(torch.equal(p, before[name]) for name, p in split.front.named_parameters()), (
        "the SGD step should have changed the front"
    )
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert {name: m.training for name, m in model.named_modules()} == flags


def test_a_split_keeps_nothing_alive_once_it_is_dropped() -> None:
    """What the cut planner learnt about a traced graph goes with the graph: a cache that
    outlived it kept every model a process ever split (30 MB a DenseNet121 split)."""
    split = split_model(build_model("small_cnn", seed=0), torch.zeros(2, 1, 28, 28), "pool1")
    alive = [weakref.ref(p) for segment in split.segments for p in segment.parameters()]
    del split
    gc.collect()
    assert [ref for ref in alive if ref() is not None] == []


# --- parameter names are kept --------------------------------------------------------------


@pytest.mark.parametrize("key", ["resnet18-layer2.0", "skip_net-ushaped", "mlp-seq-ushaped"])
def test_state_dict_names_are_the_models_and_partitioned(built, key: str) -> None:
    model, x = built[key]
    split = split_model(model, x, CASES[key][2])
    keys = [set(segment.state_dict()) for segment in split.segments]
    assert all(keys), "every segment should hold state"
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            assert not keys[i] & keys[j]
    assert set().union(*keys) == set(model.state_dict())


@pytest.mark.parametrize("key", ["resnet18-layer1", "skip_net-block1", "skip_net-ushaped"])
def test_checkpoints_load_into_segments_and_back(built, key: str) -> None:
    model, x = built[key]
    split = split_model(model, x, CASES[key][2])
    # A checkpoint of a different model of the same architecture loads into the segments...
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5).add_(0.01)
    checkpoint = other.state_dict()
    for segment in split.segments:
        segment.load_state_dict({k: checkpoint[k] for k in segment.state_dict()}, strict=True)
    other.eval()
    _set_mode(split, False)
    with torch.no_grad():
        assert torch.equal(split.forward(x), other(x))

    # ...and, after the segments train, their merged state loads into a fresh model.
    _set_mode(split, True)
    optimizer = torch.optim.SGD(list(_split_params(split).values()), lr=0.1)
    _loss(split.forward(x)).backward()
    optimizer.step()
    merged = {k: v for segment in split.segments for k, v in segment.state_dict().items()}
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(merged, strict=True)
    fresh.eval()
    _set_mode(split, False)
    with torch.no_grad():
        assert not torch.equal(fresh(x), other(x)), "the training step should show"
        assert torch.equal(fresh(x), split.forward(x))


# --- segments compute exactly what the model computes -------------------------------------


@pytest.mark.parametrize("key", list(CASES))
def test_segments_reproduce_outputs_and_gradients_exactly(built, key: str) -> None:
    original, x = built[key]
    model = copy.deepcopy(original)
    cuts = CASES[key][2]
    split = split_model(model, x, cuts)
    assert len(split.segments) == len(cuts) + 1
    assert split.cuts == cuts

    # Eval mode: outputs bit for bit, through SplitModel.forward and by hand.
    model.eval()
    _set_mode(split, False)
    with torch.no_grad():
        want = model(x)
        assert torch.equal(split.forward(x), want)
        out = split.front(x)
        assert isinstance(out, dict)
        for segment in split.segments[1:-1]:
            out = segment(**out)
            assert isinstance(out, dict)
        assert torch.equal(split.tail(**out), want)

    # Train mode: every parameter's gradient bit for bit.
    model.train()
    _set_mode(split, True)
    _loss(model(x)).backward()
    _loss(split.forward(x)).backward()
    params = _split_params(split)
    assert params.keys() == dict(model.named_parameters()).keys()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.equal(params[name].grad, p.grad), name


@pytest.mark.parametrize("key", ["mlp-seq", "resnet18-layer1", "skip_net-block1"])
def test_gradients_exact_when_the_boundary_is_detached(built, key: str) -> None:
    """As in the protocol: the back gets detached tensors, the front gets their gradients."""
    original, x = built[key]
    model = copy.deepcopy(original)
    split = split_model(model, x, CASES[key][2])
    model.train()
    _set_mode(split, True)
    _loss(model(x)).backward()

    sent = split.front(x)
    received = {k: v.detach().requires_grad_() for k, v in sent.items()}
    _loss(split.tail(**received)).backward()
    torch.autograd.backward(list(sent.values()), [received[k].grad for k in sent])
    params = _split_params(split)
    for name, p in model.named_parameters():
        assert torch.equal(params[name].grad, p.grad), name


# --- boundary descriptions ----------------------------------------------------------------


@pytest.mark.parametrize("key", list(CASES))
def test_boundaries_match_the_real_intermediate_tensors(built, key: str) -> None:
    model, x = built[key]
    _, _, cuts, modules = CASES[key]
    split = split_model(model, x, cuts)
    real = _outputs_of(model, x, [m for per_cut in modules for m in per_cut])
    assert len(split.boundaries) == len(cuts)

    _set_mode(split, False)
    with torch.no_grad():
        sent = split.front(x)
        sent_per_cut = [sent]
        for segment in split.segments[1:-1]:
            sent = segment(**sent)
            sent_per_cut.append(sent)

    for boundary, per_cut, sent in zip(split.boundaries, modules, sent_per_cut, strict=True):
        assert all(isinstance(t, BoundaryTensor) for t in boundary)
        names = [t.name for t in boundary]
        assert len(set(names)) == len(names)
        assert all(n.isidentifier() and not keyword.iskeyword(n) for n in names)
        assert list(sent) == names, "segments send what the boundary describes"
        assert len(boundary) == len(per_cut)
        for described, module in zip(boundary, per_cut, strict=True):
            tensor = real[module]
            assert described.shape == tuple(tensor.shape[1:])
            assert described.dtype == tensor.dtype
            assert described.numel == tensor[0].numel()
            assert described.nbytes == tensor[0].numel() * tensor.element_size()
            assert torch.equal(sent[described.name], tensor)
            # A module's output crosses under the module's name where that is an identifier.
            candidate = module.replace(".", "_")
            if candidate.isidentifier():
                assert described.name == candidate


def test_skip_net_block1_has_two_crossing_tensors_named_after_their_modules() -> None:
    model = build_model("skip_net", seed=0)
    x = torch.randn(2, 1, 28, 28)
    real = _outputs_of(model, x, ["stem", "block1"])
    (boundary,) = split_model(model, x, "block1").boundaries
    assert [(t.name, t.shape, t.dtype) for t in boundary] == [
        ("stem", tuple(real["stem"].shape[1:]), torch.float32),
        ("block1", tuple(real["block1"].shape[1:]), torch.float32),
    ]
    # Stride 2 twice: 28 -> 14 -> 7.
    assert [t.shape for t in boundary] == [(16, 14, 14), (32, 7, 7)]


def test_boundary_is_per_sample_whatever_the_batch() -> None:
    model = build_model("small_cnn", seed=0)
    one = split_model(model, torch.zeros(1, 1, 28, 28), "pool1").boundaries
    five = split_model(model, torch.zeros(5, 1, 28, 28), "pool1").boundaries
    assert one == five == ((BoundaryTensor("pool1", (16, 14, 14), torch.float32),),)


# --- refused cuts ---------------------------------------------------------------------------


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)


class _DataDependent(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        return self.b(h)


class _Chain(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


class _UsesInputLate(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + x


class _NumberCrosses(_TwoLayers):
    # A number read from the input's values, not its shape, cannot be recomputed.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.mean().item()
        h = self.a(x)
        return self.b(h) * k


class _SharedModule(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.b(self.a(x)))


class _SharedParameter(_TwoLayers):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(x @ self.w) @ self.w


class _TiedWeights(_TwoLayers):
    def __init__(self) -> None:
        super().__init__()
        self.b.weight = self.a.weight  # weight tying, as in autoencoders and language models

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _Skip(_TwoLayers):
    """``a -> b -> c`` plus ``a``'s output added after ``c``: it skips the middle."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(self.b(h)) + h


class _IdentityOfInputLate(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = x.flatten(1)  # for a (N, 4) input this is the input itself
        return self.b(self.a(x)) + raw


X = torch.randn(2, 4)


@pytest.mark.parametrize(
    ("model", "cuts", "pattern"),
    [
        pytest.param(_DataDependent(), "a", r"data-dependent branch", id="data-dependent"),
        pytest.param(_Chain(), "nope", r"'nope' is not a submodule", id="no-such-submodule"),
        pytest.param(_Chain(), "a.weight", r"'a\.weight' is not a submodule", id="a-parameter"),
        pytest.param(
            nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)),
            "2",
            r"'2' is not a submodule",
            id="sequential-out-of-range",
        ),
        pytest.param(
            _UsesInputLate(),
            "c",
            r"'c' is not a submodule that runs in the forward pass",
            id="never-runs",
        ),
        pytest.param(_Chain(), ("b", "a"), r"'a' must come after cut 'b'", id="out-of-order"),
        pytest.param(_Chain(), ("a", "a"), r"'a' must come after cut 'a'", id="same-cut-twice"),
        pytest.param(_Chain(), ("a", "b", "c"), r"one cut .* or two cuts .*got 3", id="three"),
        pytest.param(_Chain(), (), r"got 0", id="no-cut"),
        pytest.param(_UsesInputLate(), "a", r"model input 'x'.*raw data would leave", id="raw"),
        pytest.param(_NumberCrosses(), "a", r"not a tensor", id="non-tensor"),
        pytest.param(
            _SharedModule(), "b", r"weight 'a\.weight' is used on both sides", id="shared-module"
        ),
        pytest.param(
            _SharedParameter(), "b", r"weight 'w' is used on both sides", id="shared-parameter"
        ),
        pytest.param(_Skip(), ("a", "b"), r"skipping segment 1", id="skips-middle"),
    ],
)
def test_refused_cuts_say_why(model: nn.Module, cuts, pattern: str) -> None:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CutError, match=pattern):
        split_model(model, X, cuts)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_input_the_model_cannot_run_names_the_shape() -> None:
    model = build_model("densenet121", seed=0)
    with pytest.raises(CutError, match=r"does not run on an input of shape \[1, 1, 16, 16\]"):
        split_model(model, torch.zeros(1, 1, 16, 16), "features.denseblock1")


@pytest.mark.parametrize("example", ["not a tensor", [], torch.tensor(1.0)])
def test_bad_example_input_is_refused(example) -> None:
    with pytest.raises(CutError, match="example_input"):
        split_model(_Chain(), example, "a")


@pytest.mark.parametrize("model", ["a string", lambda x: x], ids=["str", "function"])
def test_a_non_module_is_refused_with_cut_error(model) -> None:
    with pytest.raises(CutError, match=r"expected a torch\.nn\.Module"):
        split_model(model, X, "a")


def test_tied_weights_on_both_sides_are_refused() -> None:
    model = _TiedWeights()
    with pytest.raises(CutError, match="used on both sides"):
        split_model(model, X, "a")


def test_an_unchanged_view_of_the_input_may_not_cross() -> None:
    model = _IdentityOfInputLate()
    with pytest.raises(CutError, match="raw data would leave"):
        split_model(model, X, "a")


class _ChecksItsInput(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.shape[1] == 4, "expects 4 features")
        return self.b(self.a(x))


def test_input_rejected_by_an_assert_is_a_cut_error() -> None:
    with pytest.raises(CutError, match=r"does not run on an input of shape \[2, 3\]"):
        split_model(_ChecksItsInput(), torch.randn(2, 3), "a")


def test_an_alias_of_a_submodule_cuts_where_its_first_name_does() -> None:
    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 4)
            self.alias = self.a
            self.b = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x).relu())

    model = Aliased()
    by_alias = split_model(model, torch.zeros(2, 3), "alias")
    assert by_alias.cuts == ("alias",)
    assert set(by_alias.front.state_dict()) == {"a.weight", "a.bias"}


def test_a_sum_with_the_raw_input_may_not_cross() -> None:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x) + x)

    with pytest.raises(CutError, match="raw data would leave"):
        split_model(Residual(), torch.zeros(2, 3), "a")
