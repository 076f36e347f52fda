"""Job validation: every reason a configuration is refused names its field."""

from __future__ import annotations

import pytest

from hospitals.models import Hospital
from kernel.errors import InvalidInput
from tests.platform_apps.conftest import make_hospital
from tests.platform_apps.training.conftest import report
from training.validation import job_spec_validate, model_cut_table, parse_input_shape

pytestmark = pytest.mark.django_db


def refused(data) -> dict[str, list[str]]:
    """The details of the InvalidInput ``data`` must raise."""
    with pytest.raises(InvalidInput) as error:
        job_spec_validate(data=data)
    details = error.value.details
    assert all(isinstance(r, str) for reasons in details.values() for r in reasons)
    assert sorted(details) == sorted(set(details))
    for field in details:
        assert field in error.value.message
    return details


def test_a_valid_job_is_normalised(job_data, three_hospitals) -> None:
    spec = job_spec_validate(data=job_data())
    d = spec.description
    assert (d.spatial_dims, d.in_channels, d.input_shape) == (2, 1, (1, 28, 28))
    assert d.cuts == ("pool1",) and d.mode == "vanilla"
    assert d.client_optimizer.momentum == 0.9
    stored = d.to_json()
    assert stored["version"] == 4 and stored["mode_options"] == {} and stored["model_args"] == {}
    assert stored["privacy"] == {}  # no measurement, no defense
    assert (stored["task"], stored["loss"]) == ("classification", "")
    assert stored["augmentation"] == []
    assert stored["client_optimizer"]["schedule"] == "constant"  # defaults filled in
    assert stored["server_optimizer"]["betas"] == [0.9, 0.999]
    assert [h for h, _ in spec.participants] == three_hospitals


def test_ushaped_with_two_cuts_in_order_is_valid(job_data) -> None:
    spec = job_spec_validate(data=job_data(mode="ushaped", cuts=["pool1", "pool"]))
    assert spec.description.cuts == ("pool1", "pool")


def test_unknown_model(job_data) -> None:
    details = refused(job_data(model="alexnet"))
    assert "unknown model 'alexnet'" in details["model"][0]
    assert "small_cnn" in details["model"][0]


def test_unknown_cut_lists_the_valid_ones(job_data) -> None:
    details = refused(job_data(cuts=["conv9"]))
    assert "unknown cut 'conv9'" in details["cuts"][0]
    assert "valid cuts: " in details["cuts"][0] and "pool1" in details["cuts"][0]


@pytest.mark.parametrize(("mode", "cuts"), [("vanilla", ["pool1", "pool"]), ("ushaped", ["pool1"])])
def test_cut_count_must_suit_the_mode(job_data, mode, cuts) -> None:
    details = refused(job_data(mode=mode, cuts=cuts))
    # Said once, by the job description's rule (medsplit), not again by the coordinator.
    assert len(details["cuts"]) == 1 and f"{mode} mode needs" in details["cuts"][0]


def test_cuts_out_of_order_give_medsplits_reason(job_data) -> None:
    details = refused(job_data(mode="ushaped", cuts=["pool", "pool1"]))
    assert "must come after" in details["cuts"][0]


def test_a_mode_not_registered_is_refused_with_the_known_ones(job_data) -> None:
    details = refused(job_data(mode="diagonal"))
    known = "vanilla, ushaped, splitfed, vertical"
    assert details["mode"] == [f"unknown mode 'diagonal'; known modes: {known}"]


def test_a_vertical_job_needs_two_parties_and_a_minimum_that_protects_them(
    job_data, three_hospitals
) -> None:
    one = [{"hospital": three_hospitals[0].slug}]
    details = refused(job_data(mode="vertical", cuts=["pool1", "pool"], participants=one))
    assert "vertical mode needs two or more participants" in details["participants"][0]
    details = refused(
        job_data(mode="vertical", cuts=["pool1", "pool"], mode_options={"min_records": 3})
    )
    assert "min_records must be at least 10, got 3" in details["mode_options"][0]
    spec = job_spec_validate(
        data=job_data(mode="vertical", cuts=["pool1"], mode_options={"labels": "server"})
    )
    assert spec.description.mode_options == {"join": "sum", "labels": "server", "min_records": 100}


IMAGING = {"model": "small_cnn", "input_shape": [1, 28, 28], "cut": "flatten"}


def _lab_and_imaging(job_data, hospitals, **overrides):
    """A lab (its table of 12 values and the labels, the job's tabular_mlp) and an imaging
    site running small_cnn of its own."""
    report(hospitals[0], shape=[12])
    data = job_data(
        model="tabular_mlp",
        mode="vertical",
        cuts=["block1", "block3"],
        participants=[{"hospital": h.slug} for h in hospitals[:2]],
        party_models={hospitals[1].slug: IMAGING},
    )
    return {**data, **overrides}


def test_a_vertical_party_may_run_a_model_of_its_own(job_data, three_hospitals) -> None:
    spec = job_spec_validate(data=_lab_and_imaging(job_data, three_hospitals))
    d = spec.description
    assert d.input_shape == (12,) and d.in_channels == 12
    (front,) = d.party_fronts()
    assert (front.party, front.model.name, front.cut) == (
        three_hospitals[1].slug,
        "small_cnn",
        "flatten",
    )


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ("label party", "party_models", "is the label party (the first participant)"),
        ("stranger", "party_models", "'nowhere' is not a participant of the job"),
        (
            "shape",
            "party_models",
            "its records are [1, 28, 28], its model's input_shape is [1, 32, 32]",
        ),
        ("cut", "party_models", "unknown cut 'conv9' for small_cnn"),
        ("join", "party_models", "needs every party's embedding of one shape"),
        ("horizontal", "party_models", "only a mode whose parties hold different features"),
    ],
)
def test_a_party_model_that_does_not_fit_is_refused(
    job_data, three_hospitals, change, field, reason
) -> None:
    lab, imaging = three_hospitals[0].slug, three_hospitals[1].slug
    models = {
        "label party": {lab: IMAGING},
        "stranger": {"nowhere": IMAGING},
        "shape": {imaging: {**IMAGING, "input_shape": [1, 32, 32]}},
        "cut": {imaging: {**IMAGING, "cut": "conv9"}},
        "join": {imaging: {**IMAGING, "cut": "pool1"}},  # a (16, 14, 14) map, not a vector
        "horizontal": {imaging: IMAGING},
    }[change]
    extra = {"mode": "vanilla", "cuts": ["block1"]} if change == "horizontal" else {}
    details = refused(_lab_and_imaging(job_data, three_hospitals, party_models=models, **extra))
    assert reason in " ".join(details[field]), details


def test_options_the_platform_does_not_run_yet_are_refused(job_data, monkeypatch) -> None:
    """A mode may run on the platform with some option values only (its configurations
    say which): a job with the others is refused, naming the options."""
    from medsplit.modes import MODES
    from medsplit.modes.splitfed import SplitFedMode

    class SecondVariantInProcessOnly(SplitFedMode):
        def with_options(self, values):
            bound = super().with_options(values)
            bound.runs_on_platform = bound.variant == "v1"
            return bound

    monkeypatch.setitem(MODES, "splitfed", SecondVariantInProcessOnly())
    details = refused(job_data(mode="splitfed", mode_options={"variant": "v2"}))
    assert "does not run on the platform yet" in details["mode_options"][0]


def test_splitfed_v1_is_accepted_with_its_options(job_data) -> None:
    spec = job_spec_validate(
        data=job_data(
            mode="splitfed",
            mode_options={"variant": "v1", "labels": "hospital"},
            cuts=["pool1", "pool"],
        )
    )
    assert spec.description.mode_options == {"variant": "v1", "labels": "hospital"}


def test_a_registered_mode_is_accepted_and_its_cut_count_checked(job_data, monkeypatch) -> None:
    from medsplit.modes import MODES
    from tests.medsplit.test_modes import TOY

    monkeypatch.setitem(MODES, TOY.name, TOY)
    spec = job_spec_validate(data=job_data(mode="toy", cuts=["pool1"]))
    assert spec.description.mode == "toy" and spec.description.cuts == ("pool1",)
    assert refused(job_data(mode="toy", cuts=["pool1", "pool"]))["cuts"] == [
        "toy mode needs 1 cut(s), got 2: ['pool1', 'pool']"
    ]


def test_the_training_app_loads_the_coordinators_extra_modes(job_data, settings) -> None:
    """MEDSPLIT["EXTRA_MODES"] is read when the app starts (here: its ready() again)."""
    from django.apps import apps

    from medsplit.modes import MODES

    saved = dict(MODES)
    try:
        settings.MEDSPLIT = {
            **settings.MEDSPLIT,
            "EXTRA_MODES": ["tests.medsplit.test_modes:ToyMode"],
        }
        assert "toy" not in MODES
        apps.get_app_config("training").ready()
        spec = job_spec_validate(data=job_data(mode="toy", cuts=["pool1"]))
        assert spec.description.mode == "toy"
    finally:
        MODES.clear()
        MODES.update(saved)


def test_densenet_does_not_fit_28_by_28_images(job_data) -> None:
    details = refused(job_data(model="densenet121", cuts=["features.transition1"]))
    assert list(details) == ["model"]
    reason = details["model"][0]
    assert reason.startswith("densenet121 does not fit the participants' data shape [1, 28, 28]")
    assert "does not run on an input of shape" in reason  # medsplit's CutError message


def test_a_participant_without_a_summary(job_data, hospital_b) -> None:
    Hospital.objects.filter(pk=hospital_b.pk).update(dataset_summary={})
    reasons = refused(job_data())["participants"]
    assert reasons == [
        "hospital 'city-general' has not reported a dataset summary yet; "
        "start its agent so it can report the shape of its data"
    ]


def test_participants_must_share_one_shape(job_data, hospital_b) -> None:
    report(hospital_b, shape=[3, 28, 28])
    reason = refused(job_data())["participants"][0]
    assert "one image shape" in reason and "city-general [3, 28, 28]" in reason


def test_an_unusable_reported_shape(job_data, hospital_b) -> None:
    report(hospital_b, shape=[28, 28])
    assert "unusable image shape" in refused(job_data())["participants"][0]


def test_classes_must_cover_the_reported_labels(job_data, hospital_c) -> None:
    report(hospital_c, labels=3)
    reason = refused(job_data(num_classes=2))["num_classes"][0]
    assert "labels 0, 1, 2" in reason and "at least 3" in reason


def test_unknown_codec(job_data) -> None:
    reason = refused(job_data(codec="zip"))["codec"][0]
    assert reason.startswith("unknown codec 'zip'") and "int8" in reason


@pytest.mark.parametrize(
    ("optimizer", "reason"),
    [
        ({"name": "sgd", "lr": -1}, "lr must be > 0, got -1"),
        ({"name": "rmsprop"}, "optimizer name must be one of"),
        ({"momentum": 1.5}, "momentum must be in [0, 1)"),
        ({"lr": "fast"}, "lr has the wrong type"),
        ({"lr": True}, "lr has the wrong type"),
        ({"betas": [0.9]}, "betas must be two numbers"),
        ({"nesterov": True}, "unknown option(s) ['nesterov']"),
    ],
)
def test_bad_optimizer_values(job_data, optimizer, reason) -> None:
    details = refused(job_data(server_optimizer=optimizer))
    assert list(details) == ["server_optimizer"]
    assert reason in details["server_optimizer"][0]


def test_duplicate_and_unknown_participants(job_data, hospital_a) -> None:
    data = job_data(
        participants=[{"hospital": "st-marys"}, {"hospital": "st-marys"}, {"hospital": "nowhere"}]
    )
    reasons = refused(data)["participants"]
    assert "hospital 'st-marys' is listed more than once" in reasons
    assert "no hospital 'nowhere'" in reasons


@pytest.mark.parametrize("status", ["requested", "approved", "suspended"])
def test_participants_must_be_enrolled(job_data, status) -> None:
    report(make_hospital("late-comer", status=status))
    data = job_data(participants=[{"hospital": "st-marys"}, {"hospital": "late-comer"}])
    reason = refused(data)["participants"][0]
    assert f"hospital 'late-comer' is not enrolled (status: {status})" in reason


def test_feature_sets_are_for_vertical_mode_only(job_data) -> None:
    data = job_data(participants=[{"hospital": "st-marys", "feature_set": "ct"}])
    assert refused(data)["participants"] == [
        "feature_set is used only in modes whose hospitals hold different features of the "
        "same patients; vanilla mode does not"
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", 100_000),
        ("local_epochs", 0),
        ("max_steps_per_turn", 0),
        ("rounds", 0),
        ("seed", -1),
        ("max_retries", 11),
        ("num_classes", 1),
        ("on_failure", "ignore"),
        ("participants", []),
        ("cuts", []),
        ("batch_size", "many"),
    ],
)
def test_values_out_of_range(job_data, field, value) -> None:
    details = refused(job_data(**{field: value}))
    assert field in details


def test_missing_and_unknown_fields(job_data) -> None:
    data = job_data(max_step_per_turn=5)
    del data["model"]
    details = refused(data)
    assert details["model"] == ["This field is required."]
    assert "unknown field" in details["max_step_per_turn"][0]


def test_channels_and_dims_must_match_the_data(job_data) -> None:
    details = refused(job_data(in_channels=3, spatial_dims=3))
    assert "so in_channels is 1, not 3" in details["in_channels"][0]
    assert "so spatial_dims is 2, not 3" in details["spatial_dims"][0]


def test_every_problem_is_reported_at_once(job_data) -> None:
    details = refused(job_data(codec="zip", batch_size=0, mode="diagonal", model="alexnet"))
    assert {"codec", "batch_size", "mode", "model"} <= set(details)


def test_participant_item_errors_say_which_item(job_data) -> None:
    details = refused(job_data(participants=[{"hospital": "st-marys"}, {"name": "x"}]))
    assert details["participants"] == ["item 2: hospital: This field is required."]


def test_not_an_object() -> None:
    with pytest.raises(InvalidInput):
        job_spec_validate(data=["small_cnn"])


def test_cut_table_and_shape_parsing() -> None:
    rows = model_cut_table(model_name="small_cnn", input_shape=(1, 28, 28))
    assert rows[0]["name"] == "conv1.conv" and "pool1" in [r["name"] for r in rows]
    assert parse_input_shape("1,28,28") == (1, 28, 28)
    for bad in ["", "1,28", "a,b,c", "1,0,28", "1,4096,4096"]:
        with pytest.raises(InvalidInput) as error:
            parse_input_shape(bad)
        assert "input_shape" in error.value.details
