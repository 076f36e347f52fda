"""The mode interface: the built-in modes describe themselves, the registry finds and adds
modes, and the round hooks' defaults are those of round-robin."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence

import pytest
import torch
from torch import nn

from medsplit import cli
from medsplit.channel import InMemoryChannel
from medsplit.cutting import SplitModel, split_model
from medsplit.data import DataSplit, synthetic_split
from medsplit.errors import ConfigError, ModeLoadError, RoundPlanError, UnknownModeError
from medsplit.models import get_model_spec, model_names
from medsplit.modes import (
    DEFAULT_MODE,
    MODES,
    ModeDescription,
    ModeOption,
    Side,
    SplitMode,
    StartFrom,
    get_mode,
    load_extra_modes,
    mode_names,
    mode_paths,
    register,
    require_mode,
)
from medsplit.modes.ushaped import UShapedClient, UShapedServer
from medsplit.modes.vanilla import VanillaClient, VanillaMode, VanillaServer
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import StepIds
from medsplit.training.config import TrainingConfig
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.wire import FrameKind, decode_frame

SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)


# ------------------------------------------------------------------------- a toy mode


class ToyMode(VanillaMode):
    """Vanilla's step with a round of its own: every hospital in one parallel group, the
    next round starting from the element-wise mean of their fronts. Its roles are
    vanilla's, built by vanilla's hooks with this mode's name: none is subclassed."""

    name = "toy"
    title = "Toy"
    summary = "every hospital at once; the next round starts from the mean of their fronts"

    def plan_round(self, participants: Sequence[object]) -> list[tuple[object, ...]]:
        return [tuple(participants)]

    def start_from(self, round_index: int, group_index: int) -> StartFrom:
        return StartFrom.INITIAL if round_index == 0 else StartFrom.AGGREGATE

    def combine(self, states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]}

    def options(self) -> tuple[ModeOption, ...]:
        return (ModeOption("group_size", int, 2, "hospitals per parallel group"),)


TOY = ToyMode()


class OtherToy(ToyMode):
    """Another class under the toy's name."""


class Unfinished(SplitMode):
    """Leaves every abstract hook out."""

    name = "unfinished"


class Nameless(SplitMode):
    """Has every hook but none of the class attributes."""

    client_segments = ToyMode.client_segments
    client_role = ToyMode.client_role
    server_role = ToyMode.server_role
    eval_logits = ToyMode.eval_logits


@pytest.fixture
def registry() -> Iterator[dict[str, SplitMode]]:
    """The registry, put back as it was after the test."""
    saved = dict(MODES)
    yield MODES
    MODES.clear()
    MODES.update(saved)


# ------------------------------------------------------------------- the built-in modes


def test_the_built_in_modes_are_registered_in_order() -> None:
    assert mode_names()[:2] == ["vanilla", "ushaped"]
    assert DEFAULT_MODE == "vanilla"
    assert all(MODES[name].name == name for name in MODES)


def test_vanilla_describes_itself() -> None:
    description = get_mode("vanilla").describe()
    assert isinstance(description, ModeDescription)
    assert description.to_json() == {
        "name": "vanilla",
        "title": "Vanilla",
        "summary": "the hospital keeps the first layers; the server the rest and the labels",
        "cuts": 1,
        "labels": "server",
        "segments": [
            {"index": 0, "party": "front", "side": "hospital"},
            {"index": 1, "party": "server", "side": "server"},
        ],
        "options": [],
        "runs_on_platform": True,
        "configurations": [],
        "feature_sets": False,
    }


def test_ushaped_describes_itself() -> None:
    mode = get_mode("ushaped")
    assert (mode.cuts, mode.labels, mode.server_segment) == (2, Side.HOSPITAL, 1)
    assert mode.client_segments() == {"front": 0, "head": 2}
    as_json = mode.describe().to_json()
    assert [s["party"] for s in as_json["segments"]] == ["front", "server", "head"]
    assert [s["side"] for s in as_json["segments"]] == ["hospital", "server", "hospital"]
    assert as_json["labels"] == "hospital" and as_json["options"] == []
    json.dumps(as_json)  # plain JSON all through


@pytest.mark.parametrize("name", ["vanilla", "ushaped"])
def test_no_mode_trains_features_sets_today(name: str) -> None:
    assert get_mode(name).feature_sets is False


@pytest.mark.parametrize("model", model_names())
def test_each_mode_picks_its_default_cuts_from_the_model(model: str) -> None:
    spec = get_model_spec(model)
    assert get_mode("vanilla").default_cuts(spec) == (spec.default_cut,)
    assert get_mode("ushaped").default_cuts(spec) == spec.default_cut_pair


def test_check_cuts_takes_as_many_as_the_mode_cuts() -> None:
    vanilla, ushaped = get_mode("vanilla"), get_mode("ushaped")
    assert vanilla.check_cuts("pool1") == ("pool1",)
    assert ushaped.check_cuts(["pool1", "pool"]) == ("pool1", "pool")
    with pytest.raises(ConfigError, match=r"vanilla mode needs 1 cut\(s\), got 2: \['a', 'b'\]"):
        vanilla.check_cuts(("a", "b"))
    with pytest.raises(ConfigError, match=r"ushaped mode needs 2 cut\(s\), got 1: \['a'\]"):
        ushaped.check_cuts(("a",))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 6), nn.Linear(6, 2)
    )


def _split(cuts: tuple[str, ...]) -> SplitModel:
    return split_model(_model(), torch.zeros(2, 1, 4, 4), cuts)


@pytest.mark.parametrize(
    ("name", "cuts", "client", "server"),
    [
        ("vanilla", ("2",), VanillaClient, VanillaServer),
        ("ushaped", ("2", "3"), UShapedClient, UShapedServer),
    ],
)
def test_the_roles_come_from_the_mode_and_write_its_name(
    name: str, cuts: tuple[str, ...], client: type, server: type
) -> None:
    mode = get_mode(name)
    split = _split(cuts)
    parties = {p: Party.create(split.segments[i], SGD) for p, i in mode.client_segments().items()}
    server_party = Party.create(split.segments[mode.server_segment], SGD)
    client_role = mode.client_role(parties, split)
    server_role = mode.server_role(server_party, split, job="job-1")
    assert isinstance(client_role, client) and isinstance(server_role, server)
    frame = client_role.start(
        StepIds("job-1", 0, 0, 0), torch.rand(2, 1, 4, 4), torch.tensor([0, 1])
    )
    assert frame.meta.mode == name and frame.meta.kind == FrameKind.ACTIVATIONS
    assert server_role.handle(frame).meta.mode == name


def test_a_mode_reusing_anothers_roles_gives_them_its_own_name() -> None:
    """ToyMode subclasses VanillaMode only: the roles its hooks build write "toy"."""
    mode = ToyMode()
    split = _split(("2",))
    client_role = mode.client_role({"front": Party.create(split.front, SGD)}, split)
    server_role = mode.server_role(Party.create(split.tail, SGD), split, job="job-1")
    assert type(client_role) is VanillaClient and type(server_role) is VanillaServer
    frame = client_role.start(
        StepIds("job-1", 0, 0, 0), torch.rand(2, 1, 4, 4), torch.tensor([0, 1])
    )
    assert frame.meta.mode == "toy" and server_role.handle(frame).meta.mode == "toy"


# ------------------------------------------------------------------- round-robin hooks


def test_plan_round_defaults_to_one_hospital_per_group_in_order() -> None:
    for name in ("vanilla", "ushaped"):
        assert get_mode(name).plan_round(["a", "b", "c"]) == [("a",), ("b",), ("c",)]
        assert get_mode(name).plan_round([]) == []


def test_start_from_defaults_to_the_initial_weights_then_the_previous_hand_off() -> None:
    mode = get_mode("vanilla")
    assert mode.start_from(0, 0) is StartFrom.INITIAL
    assert [mode.start_from(0, g) for g in (1, 2)] == [StartFrom.PREVIOUS] * 2
    assert [mode.start_from(r, 0) for r in (1, 5)] == [StartFrom.PREVIOUS] * 2
    assert {s.value for s in StartFrom} == {"previous", "initial", "aggregate", "own"}


def test_round_robin_never_combines() -> None:
    state = {"w": torch.ones(2)}
    with pytest.raises(RoundPlanError, match=r"ushaped mode .* never combines states"):
        get_mode("ushaped").combine([state, state])


def test_a_mode_overrides_the_round_hooks() -> None:
    assert TOY.plan_round(["a", "b"]) == [("a", "b")]
    assert TOY.start_from(1, 0) is StartFrom.AGGREGATE
    mean = TOY.combine([{"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([3.0, 5.0])}])
    assert torch.equal(mean["w"], torch.tensor([2.0, 4.0]))


# ------------------------------------------------------------------------- options


def test_options_describe_themselves() -> None:
    option = ModeOption("group_size", int, 2, "hospitals per parallel group")
    assert option.to_json() == {
        "name": "group_size",
        "type": "int",
        "default": 2,
        "help": "hospitals per parallel group",
    }
    assert TOY.describe().to_json()["options"] == [option.to_json()]


@pytest.mark.parametrize(
    ("kind", "default", "message"),
    [
        (int, "2", r"default '2' is not a int"),
        (int, True, r"default True is not a int"),
        (bool, 1, r"default 1 is not a bool"),
        (list, [], r"type must be int, float, str or bool"),
    ],
)
def test_an_option_default_must_be_of_its_type(kind: type, default: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModeOption("x", kind, default, "help")


# ------------------------------------------------------------------------- registry


def test_an_unknown_mode_lists_the_known_ones() -> None:
    with pytest.raises(
        UnknownModeError, match=r"unknown mode 'diagonal'; known modes: vanilla, ushaped"
    ):
        get_mode("diagonal")
    assert issubclass(UnknownModeError, ConfigError)
    with pytest.raises(UnknownModeError):
        get_mode(None)  # type: ignore[arg-type]


def test_register_adds_a_mode_once(registry: dict[str, SplitMode]) -> None:
    assert register(TOY) is TOY
    assert get_mode("toy") is TOY
    assert register(ToyMode()) is TOY  # the same class again: harmless
    with pytest.raises(ConfigError, match=r"'toy' is already taken by .*ToyMode; .*OtherToy needs"):
        register(OtherToy())
    assert mode_names()[-1] == "toy"


def test_a_registered_mode_is_what_a_job_can_use(registry: dict[str, SplitMode]) -> None:
    with pytest.raises(UnknownModeError):
        TrainingConfig(cuts=("2",), mode="toy")
    register(TOY)
    config = TrainingConfig(cuts=("2",), mode="toy")
    assert config.split_mode is TOY


def _bad(**attributes: object) -> SplitMode:
    return type("Bad", (ToyMode,), attributes)()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (object(), r"a mode must be a SplitMode instance"),
        (_bad(name="Toy!"), r"name must be 1 to 16 characters"),
        (_bad(name="t" * 17), r"name must be 1 to 16 characters"),
        (_bad(name="bad", cuts=0), r"cuts must be an integer >= 1, got 0"),
        (_bad(name="bad", labels="server"), r"labels must be a Side"),
        (_bad(name="bad", cuts=2), r"2 cut\(s\) make segments 0..2, and each must be held once"),
        (_bad(name="bad", server_segment=0), r"each must be held once"),
    ],
)
def test_register_refuses_an_inconsistent_mode(
    registry: dict[str, SplitMode], mode: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        register(mode)  # type: ignore[arg-type]
    assert "bad" not in MODES


def test_a_mode_class_that_leaves_out_attributes_is_refused(registry: dict[str, SplitMode]) -> None:
    with pytest.raises(ConfigError, match=r"does not set name, title, summary, cuts, labels"):
        register(Nameless())


# ------------------------------------------------------------------ load_extra_modes


@pytest.mark.parametrize(
    "path",
    [f"{__name__}:ToyMode", f"{__name__}.ToyMode", f"{__name__}:TOY", f" {__name__}:ToyMode "],
)
def test_load_extra_modes_imports_and_registers(registry: dict[str, SplitMode], path: str) -> None:
    (mode,) = load_extra_modes([path])
    assert isinstance(mode, ToyMode) and get_mode("toy") is mode
    assert load_extra_modes([path]) == [mode]  # loading twice is harmless


def test_load_extra_modes_of_nothing_adds_nothing(registry: dict[str, SplitMode]) -> None:
    before = mode_names()
    assert load_extra_modes([]) == []
    assert mode_names() == before


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("ToyMode", r"is not 'package.module:ClassName' or 'package.module.ClassName'"),
        (f"{__name__}:", r"is not 'package.module:ClassName'"),
        ("no_such_package.modes:Toy", r"cannot import 'no_such_package.modes'"),
        (f"{__name__}:Missing", r"has no 'Missing'"),
        (f"{__name__}:SGD", r"is a OptimizerConfig, not a SplitMode subclass or instance"),
        (f"{__name__}:Unfinished", r"cannot be made: .*abstract"),
    ],
)
def test_load_extra_modes_names_what_is_wrong(
    registry: dict[str, SplitMode], path: str, message: str
) -> None:
    with pytest.raises(ModeLoadError, match=message):
        load_extra_modes([path])
    assert issubclass(ModeLoadError, ConfigError)


class RecordingChannel(InMemoryChannel):
    """Remembers the mode of every frame sent."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[str] = []

    def send(self, stream: str, payload: bytes) -> None:
        self.modes.append(decode_frame(payload).meta.mode)
        super().send(stream, payload)


def test_a_loaded_mode_runs_a_job_through_the_interface(registry: dict[str, SplitMode]) -> None:
    """Nothing outside the mode's file branches on its name: an in-process job in the toy
    mode runs its roles and, with vanilla's arithmetic, ends exactly where vanilla does."""
    load_extra_modes([f"{__name__}:ToyMode"])
    data = synthetic_split(32, shape=(1, 4, 4), seed=3)
    hospitals = [
        Hospital("a", DataSplit(data.images[::2], data.labels[::2])),
        Hospital("b", DataSplit(data.images[1::2], data.labels[1::2])),
    ]
    weights = {}
    for name in ("toy", "vanilla"):
        config = TrainingConfig(
            cuts=("2",), mode=name, client_optimizer=SGD, server_optimizer=SGD, batch_size=4
        )
        channel = RecordingChannel()
        job = SplitJob(_model(), torch.zeros(2, 1, 4, 4), config, channel=channel)
        job.run(hospitals)
        assert channel.modes and set(channel.modes) == {name}
        weights[name] = job.state_dict()
    assert weights["toy"].keys() == weights["vanilla"].keys()
    assert all(torch.equal(weights["toy"][k], weights["vanilla"][k]) for k in weights["toy"])


# --------------------------------------------------- each party's own configuration


def test_mode_paths_splits_a_setting() -> None:
    assert mode_paths(None) == [] and mode_paths("") == []
    assert mode_paths(" a.b:C , ,d.e:F,") == ["a.b:C", "d.e:F"]


def test_a_party_asked_for_a_mode_it_was_not_given_names_the_setting(
    registry: dict[str, SplitMode],
) -> None:
    with pytest.raises(UnknownModeError, match=r"unknown mode 'toy'; .* name its class in X_MODES"):
        require_mode("toy", setting="X_MODES")
    register(TOY)
    assert require_mode("toy", setting="X_MODES") is TOY


def test_the_cli_loads_its_extra_modes_from_the_environment(
    registry: dict[str, SplitMode],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MEDSPLIT_EXTRA_MODES", "no_such_package.modes:Toy")
    assert cli.main(["cuts", "small_cnn"]) == 2
    assert "MEDSPLIT_EXTRA_MODES: extra mode 'no_such_package.modes:Toy'" in capsys.readouterr().err
    monkeypatch.setenv("MEDSPLIT_EXTRA_MODES", f"{__name__}:ToyMode")
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    assert "toy" in capsys.readouterr().out and isinstance(get_mode("toy"), ToyMode)


def test_a_plan_with_parallel_groups_alternates_two_hand_off_slots() -> None:
    """Round-robin keeps one relay slot per sender and recipient; a plan running several
    hospitals at once alternates two, so a sibling's next hand-off never overwrites the
    one still to be read."""
    vanilla = get_mode("vanilla")
    assert {vanilla.handoff_topic(r, 3) for r in range(4)} == {"handoff"}
    assert [TOY.handoff_topic(r, 2) for r in range(4)] == ["handoff", "handoff-odd"] * 2
    assert TOY.handoff_topic(1, 1) == "handoff", "a group of one is round-robin"
