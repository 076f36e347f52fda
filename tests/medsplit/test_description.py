"""The job description: its JSON form round-trips, every rule names its field, and a
version this code does not read is refused before anything else is looked at."""

from __future__ import annotations

import json

import pytest

from medsplit.modes import MODES, ModeOption
from medsplit.modes.vanilla import VanillaMode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.description import FORMAT, JobDescription, JobDescriptionError
from medsplit.training.setup import JobModel


def described(**overrides: object) -> dict:
    """The JSON form of a valid vanilla job, with ``overrides``."""
    data = {
        "version": FORMAT,
        "model": "small_cnn",
        "spatial_dims": 2,
        "in_channels": 1,
        "num_classes": 2,
        "input_shape": [1, 28, 28],
        "cuts": ["pool1"],
    }
    data.update(overrides)
    return data


class OptionedMode(VanillaMode):
    """Vanilla with two options of its own, to check a mode's options."""

    name = "optioned"
    title = "Optioned"
    summary = "vanilla with options"

    def options(self) -> tuple[ModeOption, ...]:
        return (
            ModeOption("share", float, 0.5, "a float option"),
            ModeOption("secure", bool, False, "a bool option"),
        )


@pytest.fixture
def optioned(monkeypatch):
    mode = OptionedMode()
    monkeypatch.setitem(MODES, mode.name, mode)
    return mode


def problems_of(data: object) -> dict[str, list[str]]:
    with pytest.raises(JobDescriptionError) as error:
        JobDescription.from_json(data)
    problems = error.value.problems
    assert problems == JobDescription.problems(data)
    for name in problems:
        assert name in str(error.value)
    return problems


def test_the_json_form_round_trips_through_text() -> None:
    description = JobDescription(
        model="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=3,
        input_shape=(1, 28, 28),
        mode="ushaped",
        cuts=("pool1", "pool"),
        client_optimizer=OptimizerConfig(name="adam", lr=0.002, betas=(0.8, 0.99)),
        server_optimizer=OptimizerConfig(momentum=0.9, schedule="step", step_size=7),
        batch_size=16,
        local_epochs=2,
        max_steps_per_turn=40,
        rounds=3,
        codec="int8",
        seed=1234,
        augmentation=({"name": "flip", "axis": 0}, {"name": "rotate", "prob": 1.0}),
    )
    text = json.dumps(description.to_json())
    back = JobDescription.from_json(json.loads(text))
    assert back == description
    assert back.to_json() == description.to_json()
    assert back.to_json()["version"] == FORMAT == 4


def test_defaults_are_filled_in() -> None:
    description = JobDescription.from_json(described())
    assert description.mode == "vanilla" and dict(description.mode_options) == {}
    assert description.client_optimizer == OptimizerConfig()
    assert (description.batch_size, description.rounds, description.codec) == (32, 1, "none")
    assert description.to_json()["client_optimizer"]["schedule"] == "constant"


def test_it_gives_todays_training_config_and_model() -> None:
    description = JobDescription.from_json(described(seed=7, batch_size=8, codec="fp16"))
    assert description.training_config("job-3") == TrainingConfig(
        cuts=("pool1",), batch_size=8, codec="fp16", seed=7, job="job-3"
    )
    assert description.job_model() == JobModel(
        name="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=2,
        input_shape=(1, 28, 28),
        seed=7,
    )
    assert description.split_mode is MODES["vanilla"]


@pytest.mark.parametrize("version", [0, 5, "1", None, True, 1.0, 2.0])
def test_another_version_is_refused_before_anything_else(version) -> None:
    # The fields of another version mean what that version says: none is looked at.
    problems = problems_of(described(version=version, model="alexnet", cuts=[]))
    assert list(problems) == ["version"]
    if version is True or version in (1, 2, 3, 4):  # 1.0 == 1 == True: only integers are read
        assert "is not one this party reads (it reads 1, 2, 3, 4)" in problems["version"][0]


def test_a_missing_version_is_refused() -> None:
    data = described()
    del data["version"]
    assert problems_of(data) == {"version": ["required: the JSON form's version (4 here)"]}


def test_version_1_is_read_as_today_s() -> None:
    """A stored or sent description of version 1 (before model_args) reads as today's
    form; model_args is not one of its fields."""
    old = described(version=1)
    description = JobDescription.from_json(old)
    assert description == JobDescription.from_json(described())
    assert description.version == FORMAT and description.to_json()["model_args"] == {}
    problems = problems_of(described(version=1, model_args={}))
    assert list(problems) == ["model_args"] and "unknown field" in problems["model_args"][0]


def test_version_2_is_read_as_today_s() -> None:
    """Version 2 (before party_models) reads as today's form, every party on the job's
    model; party_models is not one of its fields."""
    description = JobDescription.from_json(described(version=2))
    assert description == JobDescription.from_json(described())
    assert description.to_json()["party_models"] == {} and description.party_fronts() == ()
    problems = problems_of(described(version=2, party_models={}))
    assert list(problems) == ["party_models"] and "unknown field" in problems["party_models"][0]


TABLE_PARTY = {"model": "tabular_mlp", "input_shape": [12], "cut": "block1"}


def test_a_vertical_party_runs_a_model_of_its_own() -> None:
    description = JobDescription.from_json(
        described(
            mode="vertical",
            cuts=["pool1", "pool"],
            party_models={"lab": {**TABLE_PARTY, "model_args": {}}},
        )
    )
    (front,) = description.party_fronts()
    assert front.party == "lab" and front.cut == "block1"
    assert front.model.input_shape == (12,) and front.model.in_channels == 12
    assert front.model.seed == description.seed
    assert JobDescription.from_json(json.loads(json.dumps(description.to_json()))) == description


def test_a_table_model_takes_a_row_of_columns() -> None:
    description = JobDescription.from_json(
        described(
            model="tabular_mlp",
            input_shape=[12],
            in_channels=12,
            mode="vertical",
            cuts=["block1", "block3"],
        )
    )
    assert description.job_model().input_shape == (12,)
    problems = problems_of(described(model="tabular_mlp", input_shape=[1, 28, 28]))
    assert "takes a table's rows" in problems["input_shape"][0]


@pytest.mark.parametrize(
    ("party_models", "reason"),
    [
        ({"lab": TABLE_PARTY}, "only a mode whose parties hold different features"),
        ({"lab": {**TABLE_PARTY, "cut": ""}}, "lab: cut must be a submodule's name"),
        ({"lab": {**TABLE_PARTY, "input_shape": [0]}}, "lab: input_shape must be 1 to 4"),
        ({"lab": {**TABLE_PARTY, "model": "alexnet"}}, "lab: unknown model 'alexnet'"),
        ({"lab": {**TABLE_PARTY, "depth": 3}}, "lab: unknown key 'depth'"),
        ({"lab": {**TABLE_PARTY, "model_args": {"a": 1}}}, "lab: tabular_mlp is a registry"),
        ({"lab": "tabular_mlp"}, "lab: an object with model"),
    ],
)
def test_a_wrong_party_model_is_named(party_models, reason) -> None:
    mode = {} if "only a mode" in reason else {"mode": "vertical", "cuts": ["pool1", "pool"]}
    problems = problems_of(described(party_models=party_models, **mode))
    assert list(problems) == ["party_models"], problems
    assert problems["party_models"][0].startswith(reason), problems


def test_missing_and_unknown_fields_are_named() -> None:
    data = described(cut="pool1", extra=1)
    del data["cuts"], data["num_classes"]
    problems = problems_of(data)
    assert problems["cuts"] == ["required"] and problems["num_classes"] == ["required"]
    assert problems["cut"][0].startswith("unknown field; known fields: version, model")
    assert "extra" in problems


def test_not_an_object_is_refused() -> None:
    assert list(problems_of(["small_cnn"])) == ["non_field_errors"]


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("model", "alexnet", "unknown model 'alexnet'; known models: "),
        ("model", 3, "has the wrong type: 3"),
        ("spatial_dims", 1, "must be an integer >= 2, got 1"),
        ("spatial_dims", 4, "must be 2 or 3, got 4"),
        ("spatial_dims", "2", "has the wrong type"),
        ("in_channels", 0, "must be an integer >= 1, got 0"),
        ("num_classes", 1, "must be an integer >= 2, got 1"),
        ("num_classes", True, "has the wrong type: True"),
        ("input_shape", [1, 0, 28], "must be positive integers"),
        ("input_shape", "1,28,28", "has the wrong type"),
        ("input_shape", [1, 28], "has 2 values; spatial_dims 2 takes channels and 2 sides"),
        ("input_shape", [3, 28, 28], "has 3 channel(s), not in_channels 1"),
        ("mode", "diagonal", "unknown mode 'diagonal'; known modes: vanilla, ushaped"),
        ("cuts", ["pool1", "pool"], "vanilla mode needs 1 cut(s), got 2: ['pool1', 'pool']"),
        ("cuts", [], "vanilla mode needs 1 cut(s), got 0"),
        ("cuts", [""], "must be a list of submodule names"),
        ("cuts", "pool1", "has the wrong type"),
        ("mode_options", {"share": 1}, "vanilla mode has no option 'share' (it takes none)"),
        ("mode_options", [], "has the wrong type"),
        ("client_optimizer", {"lr": -1}, "lr must be > 0, got -1"),
        ("client_optimizer", {"name": "rmsprop"}, "optimizer name must be one of"),
        ("server_optimizer", {"nesterov": True}, "unknown option(s) ['nesterov']"),
        ("server_optimizer", {"lr": "fast"}, "lr has the wrong type or value: 'fast'"),
        ("server_optimizer", {"betas": [0.9]}, "betas must be two numbers in [0, 1)"),
        ("server_optimizer", [], "an optimizer is a JSON object"),
        ("batch_size", 0, "must be an integer >= 1, got 0"),
        ("local_epochs", 0, "must be an integer >= 1, got 0"),
        ("max_steps_per_turn", 0, "must be >= 1 or null, got 0"),
        ("max_steps_per_turn", 2.5, "has the wrong type"),
        ("rounds", -1, "must be an integer >= 1, got -1"),
        ("codec", "zip", "unknown codec 'zip'; known codecs: none, fp16, bf16, int8"),
        ("seed", -1, "must be an integer >= 0, got -1"),
        ("seed", 2**31, "must be at most 2147483647"),
    ],
)
def test_every_rule_names_its_field(name: str, value: object, reason: str) -> None:
    problems = problems_of(described(**{name: value}))
    assert list(problems) == [name]
    assert reason in problems[name][0]


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of(described(codec="zip", batch_size=0, mode="diagonal", model="x"))
    assert {"codec", "batch_size", "mode", "model"} == set(problems)


def test_the_cut_count_follows_the_mode() -> None:
    assert JobDescription.from_json(described(mode="ushaped", cuts=["pool1", "pool"])).cuts == (
        "pool1",
        "pool",
    )
    assert problems_of(described(mode="ushaped")) == {
        "cuts": ["ushaped mode needs 2 cut(s), got 1: ['pool1']"]
    }


def test_the_constructor_checks_the_same_rules() -> None:
    with pytest.raises(JobDescriptionError) as error:
        JobDescription(
            model="small_cnn",
            spatial_dims=2,
            in_channels=1,
            num_classes=2,
            input_shape=(1, 28, 28),
            cuts=("pool1", "pool"),
            codec="zip",
        )
    assert set(error.value.problems) == {"cuts", "codec"}


def test_a_modes_options_take_their_defaults_and_their_types(optioned) -> None:
    description = JobDescription.from_json(described(mode="optioned"))
    assert dict(description.mode_options) == {"share": 0.5, "secure": False}
    given = JobDescription.from_json(described(mode="optioned", mode_options={"share": 1}))
    assert dict(given.mode_options) == {"share": 1, "secure": False}
    assert JobDescription.from_json(given.to_json()) == given
    problems = problems_of(
        described(mode="optioned", mode_options={"secure": 1, "share": "half", "speed": 2})
    )
    assert problems["mode_options"] == [
        "optioned mode has no option 'speed' (it takes share, secure)",
        "share must be a float, got 'half'",
        "secure must be a bool, got 1",
    ]


FACTORY = "medsplit.models.small_cnn:small_cnn"
ARGS = {"spatial_dims": 2, "in_channels": 1, "num_classes": 2}


def test_a_factory_model_and_its_arguments_round_trip() -> None:
    """A MODULE:FACTORY model's form is checked here; whether a party may import its
    module is that party's own list's to say (nothing is imported reading it)."""
    description = JobDescription.from_json(described(model=FACTORY, model_args=ARGS))
    assert description.model == FACTORY and dict(description.model_args) == ARGS
    assert JobDescription.from_json(json.loads(json.dumps(description.to_json()))) == description
    model = description.job_model()
    assert model.name == FACTORY
    assert model.model_args == '{"in_channels":1,"num_classes":2,"spatial_dims":2}'
    assert hash(model) == hash(JobDescription.from_json(description.to_json()).job_model())
    registry = JobDescription.from_json(described()).job_model()
    assert registry.model_args == "" and registry == JobModel("small_cnn", 2, 1, 2, (1, 28, 28), 0)


@pytest.mark.parametrize(
    ("overrides", "name", "reason"),
    [
        ({"model_args": {"channels": 3}}, "model_args", "small_cnn is a registry model: it takes"),
        ({"model": FACTORY, "model_args": [1]}, "model_args", "has the wrong type"),
        ({"model": FACTORY, "model_args": {"w": "x" * 5000}}, "model_args", "at most 4096 bytes"),
        ({"model": FACTORY, "model_args": {"w": float("nan")}}, "model_args", "plain JSON"),
        ({"model": "os:system", "model_args": {"x": {1, 2}}}, "model_args", "plain JSON"),
        ({"model": "a b:c"}, "model", "is not a model name of the form MODULE:FACTORY"),
        ({"model": "m:" + "f" * 200}, "model", "is not a model name of the form"),
    ],
)
def test_model_args_rules_name_their_field(overrides: dict, name: str, reason: str) -> None:
    if isinstance(overrides.get("model_args"), dict) and any(
        isinstance(v, set) for v in overrides["model_args"].values()
    ):  # not JSON at all: only the constructor can be handed it
        with pytest.raises(JobDescriptionError) as error:
            JobDescription(
                model=overrides["model"],
                model_args=overrides["model_args"],
                spatial_dims=2,
                in_channels=1,
                num_classes=2,
                input_shape=(1, 28, 28),
                cuts=("pool1",),
            )
        problems = error.value.problems
    else:
        problems = problems_of(described(**overrides))
    assert list(problems) == [name]
    assert reason in problems[name][0]


def test_partial_checks_skip_what_is_absent() -> None:
    assert JobDescription.problems({"codec": "none", "mode": "ushaped"}, partial=True) == {}
    assert JobDescription.problems({"codec": "zip"}, partial=True) == {
        "codec": ["unknown codec 'zip'; known codecs: none, fp16, bf16, int8"]
    }


def test_version_2_is_read_as_version_3_without_augmentation() -> None:
    old = described(version=2)
    description = JobDescription.from_json(old)
    assert description == JobDescription.from_json(described())
    assert description.augmentation == () and description.to_json()["augmentation"] == []
    problems = problems_of(described(version=2, augmentation=[]))
    assert list(problems) == ["augmentation"] and "unknown field" in problems["augmentation"][0]


def test_augmentation_is_filled_in_and_reaches_the_training_config() -> None:
    description = JobDescription.from_json(described(augmentation=[{"name": "rotate90"}]))
    assert description.to_json()["augmentation"] == [{"name": "rotate90", "prob": 0.5}]
    assert description.training_config("job-1").augmentation == description.augmentation


@pytest.mark.parametrize(
    ("augmentation", "reason"),
    [
        ({"name": "flip"}, "has the wrong type"),
        (["flip"], "item 0: must be an object with a transform's name"),
        ([{"name": "blur"}], "item 0: unknown transform 'blur'; known: flip, rotate90"),
        ([{"name": "flip", "angle": 3}], "item 0 (flip): unknown parameter 'angle' (it takes"),
        (
            [{"name": "flip"}, {"name": "flip", "prob": 1.5}],
            "item 1 (flip): prob must be a number in [0.0, 1.0], got 1.5",
        ),
        ([{"name": "rotate", "degrees": 270}], "degrees must be a number in [0.0, 180.0], got 270"),
        ([{"name": "rotate", "prob": True}], "prob must be a number in [0.0, 1.0], got True"),
        ([{"name": "flip", "axis": 2}], "flip axis 2 is not one of the images' 2 spatial axes"),
        ([{"name": "flip", "axis": 0.5}], "axis must be an integer in [0, 2], got 0.5"),
        ([{"name": "flip"}] * 17, "at most 16 transforms, got 17"),
    ],
)
def test_augmentation_rules_name_their_field(augmentation: object, reason: str) -> None:
    problems = problems_of(described(augmentation=augmentation))
    assert list(problems) == ["augmentation"]
    assert any(reason in r for r in problems["augmentation"]), problems


def test_augmentation_is_refused_where_it_cannot_be_done_right() -> None:
    square = problems_of(described(input_shape=[1, 28, 32], augmentation=[{"name": "rotate90"}]))
    assert square == {
        "augmentation": ["item 0 (rotate90): rotate90 needs square images, not H x W 28 x 32"]
    }
    vertical = problems_of(
        described(mode="vertical", cuts=["pool1", "pool"], augmentation=[{"name": "flip"}])
    )
    assert list(vertical) == ["augmentation"]
    assert "parties hold different features of the same records" in vertical["augmentation"][0]


def test_version_3_is_read_as_today_s() -> None:
    """Version 3 (before privacy) reads as today's form, every measurement and defense off;
    privacy is not one of its fields."""
    description = JobDescription.from_json(described(version=3))
    assert description == JobDescription.from_json(described())
    assert description.to_json()["privacy"] == {} and not description.privacy.defended
    problems = problems_of(described(version=3, privacy={}))
    assert list(problems) == ["privacy"] and "unknown field" in problems["privacy"][0]


def test_privacy_options_round_trip_and_reach_the_training_config() -> None:
    privacy = {
        "activation_noise": {"clip_norm": 2.0, "target_epsilon": 8.0},
        "nopeek": {"weight": 0.5},
        "label_noise": {"epsilon": 1.0},
        "audit": {"every_rounds": 2},
    }
    description = JobDescription.from_json(described(privacy=privacy))
    assert description.privacy.defended and description.privacy.audit.every_rounds == 2
    form = description.to_json()["privacy"]
    assert form["activation_noise"] == {
        "clip_norm": 2.0,
        "noise_multiplier": None,
        "target_epsilon": 8.0,
        "delta": 1e-5,
    }
    back = JobDescription.from_json(json.loads(json.dumps(description.to_json())))
    assert back == description
    assert description.training_config("job-1").privacy == description.privacy


def test_privacy_problems_name_the_setting_and_the_mode() -> None:
    problems = problems_of(
        described(
            mode="ushaped",
            cuts=["pool1", "pool"],
            privacy={
                "activation_noise": {"clip_norm": -1, "noise_multiplier": 1.0},
                "label_noise": {"epsilon": 1.0},
                "magic": {},
            },
        )
    )
    reasons = " / ".join(problems["privacy"])
    assert "unknown part 'magic'" in reasons
    assert "activation_noise.clip_norm must be a number > 0, got -1" in reasons
    # U-shaped keeps its labels at home: randomising labels that never travel is refused.
    ushaped = problems_of(
        described(mode="ushaped", cuts=["pool1", "pool"], privacy={"label_noise": {}})
    )
    assert "label_noise protects labels that travel" in ushaped["privacy"][0]
    vanilla = problems_of(described(privacy={"gradient_noise": {"scale": 0.5}}))
    assert "gradient_noise protects the labels a hospital keeps" in vanilla["privacy"][0]
    both = problems_of(described(privacy={"activation_noise": {"clip_norm": 1.0}}))
    assert "exactly one of noise_multiplier" in both["privacy"][0]
    typo = problems_of(described(privacy={"nopeek": {"wieght": 1}}))
    assert "nopeek has no setting 'wieght' (it takes weight)" in typo["privacy"][0]


def test_a_vertical_job_takes_no_activation_noise_nor_hijack_check() -> None:
    # Each party's own Poisson draw would break the parties' shared batches, and a party's
    # front is not the model's first segment: both are refused before any party builds.
    problems = problems_of(
        described(
            mode="vertical",
            cuts=["pool1", "pool"],
            privacy={
                "activation_noise": {"noise_multiplier": 1.0},
                "hijack_detection": {"method": "splitout"},
            },
        )
    )
    reasons = " / ".join(problems["privacy"])
    assert "activation_noise is not available in a mode whose parties hold" in reasons
    assert "hijack_detection is not available" in reasons
    # SplitGuard's fake labels must travel with the activations: vanilla mode only.
    splitguard = problems_of(
        described(
            mode="vertical",
            cuts=["pool1", "pool"],
            privacy={"hijack_detection": {"method": "splitguard"}},
        )
    )
    assert "hijack_detection is not available" in splitguard["privacy"][0]


def test_splitguard_is_accepted_in_vanilla_mode_and_refused_where_labels_stay() -> None:
    guard = {"hijack_detection": {"method": "splitguard"}}
    assert JobDescription.problems(described(privacy=guard)) == {}
    # The server trains on the fake batches: not exact, unlike SplitOut's reading only.
    assert JobDescription.from_json(described(privacy=guard)).privacy.defended
    splitout = {"hijack_detection": {"method": "splitout"}}
    assert not JobDescription.from_json(described(privacy=splitout)).privacy.defended
    problems = problems_of(described(mode="ushaped", cuts=["pool1", "pool"], privacy=guard))
    assert "available in vanilla mode only" in " / ".join(problems["privacy"])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"probe_probability": 0}, "hijack_detection.probe_probability must be a number in (0, 1)"),
        ({"probe_probability": 0.0}, "hijack_detection.probe_probability"),
        ({"probe_probability": 1}, "hijack_detection.probe_probability"),
        ({"probe_probability": 1.5}, "hijack_detection.probe_probability"),
        ({"probe_probability": -0.1}, "hijack_detection.probe_probability"),
        ({"probe_probability": "0.1"}, "hijack_detection.probe_probability"),
        ({"probe_probability": True}, "hijack_detection.probe_probability"),
        ({"probe_probability": None}, "hijack_detection.probe_probability"),
        ({"threshold": 0}, "hijack_detection.threshold must be a number in (0, 1)"),
        ({"threshold": 1}, "hijack_detection.threshold"),
        ({"min_probes": 0}, "hijack_detection.min_probes must be an integer in [1, 1000]"),
        ({"min_probes": 2.5}, "hijack_detection.min_probes"),
        ({"start_step": -1}, "hijack_detection.start_step must be an integer in [0, 100000]"),
        ({"power": 0}, "hijack_detection.power must be a number in (0, 100]"),
        ({"method": "magic"}, "hijack_detection.method must be one of splitout, splitguard"),
    ],
)
def test_splitguard_settings_out_of_range_are_refused_by_name(settings: dict, named: str) -> None:
    problems = problems_of(
        described(privacy={"hijack_detection": {"method": "splitguard", **settings}})
    )
    assert list(problems) == ["privacy"]
    (reason,) = problems["privacy"]
    assert named in reason
    # The setting's value is quoted back, so the message says what was wrong with it.
    (value,) = settings.values()
    assert repr(value) in reason


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"honest_records": 3}, "hijack_detection.honest_records must be an integer in [16, "),
        ({"simulated_epochs": 0}, "hijack_detection.simulated_epochs must be an integer in [1, "),
        ({"neighbours": 0}, "hijack_detection.neighbours must be an integer in [1, 10000] or null"),
        ({"window": 0}, "hijack_detection.window must be an integer in [1, 1000]"),
        (
            {"window": 3, "outliers": 4},
            "hijack_detection.outliers must be an integer in [1, window=3]",
        ),
    ],
)
def test_splitout_settings_out_of_range_are_refused_by_name(settings: dict, named: str) -> None:
    problems = problems_of(described(privacy={"hijack_detection": settings}))
    assert any(named in reason for reason in problems["privacy"]), problems


def test_the_description_in_code_refuses_a_probe_probability_of_zero() -> None:
    # Not only its JSON form: options built in code are checked as they are made.
    from medsplit.defenses import HijackDetection, PrivacyOptions
    from medsplit.defenses.options import PrivacyOptionsError

    with pytest.raises(
        PrivacyOptionsError, match=r"probe_probability must be a number in \(0, 1\)"
    ):
        PrivacyOptions(hijack_detection=HijackDetection(method="splitguard", probe_probability=0))
    ok = PrivacyOptions(
        hijack_detection=HijackDetection(method="splitguard", probe_probability=0.5)
    )
    assert ok.hijack_detection is not None and ok.hijack_detection.probe_probability == 0.5
