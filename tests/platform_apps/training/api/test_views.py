"""The training API: every endpoint's success, each role's denial, cross-hospital 404s and
the error body of bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from audit.models import AuditEvent
from medsplit.protocol.optim import OPTIMIZERS, SCHEDULES, OptimizerConfig
from medsplit.training.augment import TRANSFORMS
from medsplit.training.description import JobDescription
from medsplit.wire.codecs import CODECS
from training import services
from training.models import Job

pytestmark = pytest.mark.django_db


def error(response, status: int, code: str) -> dict:
    """Check the one error shape and return its details."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "details"}
    assert body["code"] == code and body["message"]
    return body["details"]


@pytest.fixture
def jobs(make_job, hospital_a, hospital_b, hospital_c) -> dict[str, Job]:
    """``ac``: St Mary's and Northside; ``bc``: City General and Northside."""
    return {
        "ac": make_job(participants=[{"hospital": h.slug} for h in (hospital_a, hospital_c)]),
        "bc": make_job(participants=[{"hospital": h.slug} for h in (hospital_b, hospital_c)]),
    }


@pytest.fixture
def admin(client_for, consortium_admin) -> APIClient:
    return client_for(consortium_admin)


@pytest.fixture
def hal(client_for, hospital_admin) -> APIClient:
    """Hospital admin of St Mary's (hospital A)."""
    return client_for(hospital_admin)


@pytest.fixture
def olga(client_for, observer) -> APIClient:
    return client_for(observer)


@pytest.fixture
def nora(client_for, no_role_person) -> APIClient:
    return client_for(no_role_person)


def started(job: Job) -> Job:
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    services.turn_record_progress(
        turn=turn, steps=3, samples=48, bytes_up=300, bytes_down=270, loss=0.7
    )
    return job


# -- the registry -----------------------------------------------------------------------


def test_models_lists_the_registry(admin, olga) -> None:
    for client in (admin, olga):
        response = client.get("/api/models/")
        assert response.status_code == 200
        small = {m["name"]: m for m in response.json()}["small_cnn"]
        assert small["default_input_shape"] == [1, 28, 28] and small["default_cut"] == "pool1"
        # The job form offers a segmentation job only the models that segment.
        tasks = {m["name"]: m["tasks"] for m in response.json()}
        assert tasks["small_cnn"] == ["classification"] and "segmentation" in tasks["unet"]
        # Each mode picks the model's default cuts (medsplit.modes.SplitMode.default_cuts).
        assert small["default_cuts"] == {
            "vanilla": ["pool1"],
            "ushaped": ["pool1", "pool"],
            "splitfed": ["pool1"],
            "vertical": ["pool1", "pool"],
        }


def test_models_refuse_no_role_agents_and_strangers(nora, agent_client, hospital_a) -> None:
    error(nora.get("/api/models/"), 403, "permission_denied")
    error(agent_client(hospital_a).get("/api/models/"), 403, "permission_denied")
    response = APIClient().get("/api/models/")
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "not_authenticated"


def test_model_modules_tell_consortium_admins_which_factories_the_coordinator_builds(
    admin, olga, hal, nora
) -> None:
    from tests.model_modules import listed
    from training.apps import MODEL_MODULES_SETTING

    with listed(["medsplit.models", "torch.nn"], setting=MODEL_MODULES_SETTING):
        response = admin.get("/api/model-modules/")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "modules": ["medsplit.models", "torch.nn"],
        "setting": MODEL_MODULES_SETTING,
    }
    with listed([], setting=MODEL_MODULES_SETTING):
        assert admin.get("/api/model-modules/").json()["modules"] == []
    # Only those who may create jobs: the list names code the coordinator trusts.
    for client in (olga, hal, nora):
        error(client.get("/api/model-modules/"), 403, "permission_denied")


def test_a_vertical_job_below_the_min_records_floor_is_a_400_on_mode_options(
    admin, job_data
) -> None:
    options = {"join": "sum", "labels": "hospital", "min_records": 5}
    data = job_data(mode="vertical", cuts=["pool1", "pool"], mode_options=options)
    details = error(admin.post("/api/jobs/", data, format="json"), 400, "invalid")
    assert "min_records must be at least 10" in details["mode_options"][0]


def test_modes_list_the_registry_as_each_mode_describes_itself(admin, olga, hal) -> None:
    for client in (admin, olga, hal):
        response = client.get("/api/modes/")
        assert response.status_code == 200, response.content
        modes = {m["name"]: m for m in response.json()}
        assert list(modes) == ["vanilla", "ushaped", "splitfed", "vertical"]
        # Described with its default options (SFLV1), which the platform runs.
        assert modes["splitfed"]["runs_on_platform"] is True
        # Vertical: its joins and label placements (min_records, without choices, keeps
        # its default in each).
        vertical = modes["vertical"]
        assert [o["name"] for o in vertical["options"]] == ["join", "labels", "min_records"]
        assert [sorted(c["options"]) for c in vertical["configurations"]] == [
            ["join", "labels"]
        ] * 6
        assert modes["vanilla"] == {
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
        ushaped = modes["ushaped"]
        assert (ushaped["cuts"], ushaped["labels"]) == (2, "hospital")
        assert [s["side"] for s in ushaped["segments"]] == ["hospital", "server", "hospital"]


def test_codecs_list_the_registry_and_say_which_is_exact(admin, olga, hal) -> None:
    for client in (admin, olga, hal):
        response = client.get("/api/codecs/")
        assert response.status_code == 200, response.content
        codecs = response.json()
        assert [c["name"] for c in codecs] == list(CODECS)
        assert codecs[0] == {
            "name": "none",
            "exact": True,
            "summary": "every tensor as it is, bit for bit: training stays exact",
        }
        assert [c["name"] for c in codecs if c["exact"]] == ["none"]
    assert APIClient().get("/api/codecs/").status_code in (401, 403)


def test_optimizers_list_each_with_its_options_and_defaults(admin, hal) -> None:
    for client in (admin, hal):
        response = client.get("/api/optimizers/")
        assert response.status_code == 200, response.content
        body = response.json()
        assert [o["name"] for o in body["optimizers"]] == list(OPTIMIZERS)
        assert [s["name"] for s in body["schedules"]] == list(SCHEDULES)
        sgd = {o["name"]: o["default"] for o in body["optimizers"][0]["options"]}
        assert sgd == {"lr": 0.01, "momentum": 0.0, "weight_decay": 0.0}
        step = {o["name"] for o in body["schedules"][1]["options"]}
        assert step == {"step_size", "gamma"}
        assert OptimizerConfig.from_json(body["defaults"]) == OptimizerConfig()
    assert APIClient().get("/api/optimizers/").status_code in (401, 403)


def test_augmentations_list_each_transform_with_its_parameters(admin, hal) -> None:
    for client in (admin, hal):
        response = client.get("/api/augmentations/")
        assert response.status_code == 200, response.content
        body = response.json()
        assert [t["name"] for t in body] == list(TRANSFORMS)
        assert body[0]["name"] == "flip" and body[0]["params"] == {"prob": 0.5, "axis": 1}
        assert all(t["description"] for t in body)
    assert APIClient().get("/api/augmentations/").status_code in (401, 403)


def test_modes_show_a_mode_registered_later(admin, monkeypatch) -> None:
    from medsplit.modes import MODES
    from tests.medsplit.test_modes import TOY

    monkeypatch.setitem(MODES, TOY.name, TOY)
    toy = admin.get("/api/modes/").json()[-1]
    assert toy["name"] == "toy" and toy["options"] == [
        {"name": "group_size", "type": "int", "default": 2, "help": "hospitals per parallel group"}
    ]


def test_modes_refuse_no_role_agents_and_strangers(nora, agent_client, hospital_a) -> None:
    error(nora.get("/api/modes/"), 403, "permission_denied")
    error(agent_client(hospital_a).get("/api/modes/"), 403, "permission_denied")
    response = APIClient().get("/api/modes/")
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "not_authenticated"


def test_cut_table_of_a_model(admin) -> None:
    response = admin.get("/api/models/small_cnn/cuts/", {"input_shape": "1,28,28"})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "small_cnn" and body["input_shape"] == [1, 28, 28]
    pool1 = {row["name"]: row for row in body["cuts"]}["pool1"]
    assert pool1["crossing"][0]["shape"][0] == 16 and pool1["bytes_per_sample"] > 0
    default = admin.get("/api/models/small_cnn/cuts/").json()
    assert default["input_shape"] == [1, 28, 28]


def test_a_cut_table_goes_as_deep_as_asked(admin) -> None:
    shallow = admin.get("/api/models/skip_net/cuts/", {"depth": "1"}).json()["cuts"]
    deep = admin.get("/api/models/skip_net/cuts/", {"depth": "3"}).json()["cuts"]
    assert all("." not in row["name"] for row in shallow)
    assert {r["name"] for r in shallow} < {r["name"] for r in deep}
    for bad in ("0", "17", "x"):
        details = error(admin.get("/api/models/skip_net/cuts/", {"depth": bad}), 400, "invalid")
        assert details["depth"] == [f"must be an integer from 1 to 16, got {bad!r}"]


def test_cut_table_errors(admin, nora) -> None:
    error(admin.get("/api/models/alexnet/cuts/"), 404, "not_found")
    details = error(
        admin.get("/api/models/small_cnn/cuts/", {"input_shape": "1,x"}), 400, "invalid"
    )
    assert "input_shape" in details
    details = error(
        admin.get("/api/models/densenet121/cuts/", {"input_shape": "1,28,28"}), 400, "invalid"
    )
    assert "does not run on an input of shape" in details["input_shape"][0]
    error(nora.get("/api/models/small_cnn/cuts/"), 403, "permission_denied")


# -- creating jobs ----------------------------------------------------------------------


def test_consortium_admin_creates_a_draft_job(admin, job_data, three_hospitals) -> None:
    response = admin.post("/api/jobs/", job_data(), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "draft" and body["model"] == "small_cnn"
    described = body["description"]
    assert described["in_channels"] == 1 and described["input_shape"] == [1, 28, 28]
    assert JobDescription.from_json(described) == Job.objects.get().job_description()
    assert (body["mode"], body["rounds"]) == (described["mode"], described["rounds"])
    assert [p["hospital"] for p in body["participants"]] == [h.slug for h in three_hospitals]
    assert [p["position"] for p in body["participants"]] == [0, 1, 2]
    assert body["created_by"] == "ada"
    assert AuditEvent.objects.filter(action="job.created", job_id=body["id"]).exists()


def test_a_job_stores_its_augmentation_and_a_bad_one_is_named(admin, job_data) -> None:
    bad = job_data(augmentation=[{"name": "flip", "prob": 3}, {"name": "warp"}])
    details = error(admin.post("/api/jobs/", bad, format="json"), 400, "invalid")
    assert list(details) == ["augmentation"] and len(details["augmentation"]) == 2
    assert "unknown transform 'warp'" in details["augmentation"][1]
    good = job_data(augmentation=[{"name": "rotate", "degrees": 10}])
    response = admin.post("/api/jobs/", good, format="json")
    assert response.status_code == 201, response.content
    stored = Job.objects.get().job_description().augmentation
    assert [dict(t) for t in stored] == [{"name": "rotate", "prob": 0.5, "degrees": 10.0}]
    assert response.json()["description"]["augmentation"] == [dict(t) for t in stored]


def test_bad_job_gets_the_error_shape_and_creates_nothing(admin, job_data) -> None:
    response = admin.post("/api/jobs/", job_data(cuts=["conv9"], codec="zip"), format="json")
    details = error(response, 400, "invalid")
    assert "valid cuts: " in details["cuts"][0]
    assert details["codec"][0].startswith("unknown codec")
    assert not Job.objects.exists()


def test_only_consortium_admins_create_jobs(
    hal, olga, nora, agent_client, hospital_a, job_data
) -> None:
    for client in (hal, olga, nora, agent_client(hospital_a)):
        error(client.post("/api/jobs/", job_data(), format="json"), 403, "permission_denied")
    assert APIClient().post("/api/jobs/", job_data(), format="json").status_code in (401, 403)
    assert not Job.objects.exists()


# -- reading jobs -----------------------------------------------------------------------


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {job["id"] for job in response.json()["results"]}


def test_job_list_visibility(admin, olga, hal, nora, agent_client, hospital_a, jobs) -> None:
    every = {jobs["ac"].pk, jobs["bc"].pk}
    assert ids(admin.get("/api/jobs/")) == every
    assert ids(olga.get("/api/jobs/")) == every
    assert ids(hal.get("/api/jobs/")) == {jobs["ac"].pk}
    error(nora.get("/api/jobs/"), 403, "permission_denied")
    error(agent_client(hospital_a).get("/api/jobs/"), 403, "permission_denied")


def test_job_list_filters_and_pages(admin, jobs) -> None:
    started(jobs["bc"])
    assert ids(admin.get("/api/jobs/", {"state": "running"})) == {jobs["bc"].pk}
    assert ids(admin.get("/api/jobs/", {"hospital": "st-marys"})) == {jobs["ac"].pk}
    assert ids(admin.get("/api/jobs/", {"hospital": "northside"})) == {
        jobs["ac"].pk,
        jobs["bc"].pk,
    }
    assert ids(admin.get("/api/jobs/", {"model": "resnet18"})) == set()
    page = admin.get("/api/jobs/", {"page_size": 1}).json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"]
    details = error(admin.get("/api/jobs/", {"state": "exploded"}), 400, "invalid")
    assert "state" in details


def test_job_detail_and_cross_hospital_404(admin, hal, olga, nora, jobs) -> None:
    response = admin.get(f"/api/jobs/{jobs['bc'].pk}/")
    assert response.status_code == 200
    assert response.json()["description"]["client_optimizer"]["momentum"] == 0.9
    assert hal.get(f"/api/jobs/{jobs['ac'].pk}/").status_code == 200
    assert olga.get(f"/api/jobs/{jobs['bc'].pk}/").status_code == 200
    error(hal.get(f"/api/jobs/{jobs['bc'].pk}/"), 404, "not_found")
    error(admin.get("/api/jobs/999999/"), 404, "not_found")
    error(nora.get(f"/api/jobs/{jobs['ac'].pk}/"), 403, "permission_denied")


def test_status_summarises_progress(admin, hal, jobs, hospital_a) -> None:
    job = started(jobs["ac"])
    body = admin.get(f"/api/jobs/{job.pk}/status/").json()
    assert body["state"] == "running" and body["round"] == 0 and body["rounds"] == 2
    assert body["hospital"] == hospital_a.slug
    assert body["turn"]["status"] == "running" and body["turn"]["steps"] == 3
    assert body["totals"] == {"steps": 3, "samples": 48, "bytes_up": 300, "bytes_down": 270}
    assert body["last_loss"] == 0.7
    assert hal.get(f"/api/jobs/{job.pk}/status/").status_code == 200
    error(hal.get(f"/api/jobs/{jobs['bc'].pk}/status/"), 404, "not_found")


def test_status_of_a_draft(admin, jobs) -> None:
    body = admin.get(f"/api/jobs/{jobs['ac'].pk}/status/").json()
    assert body["state"] == "draft" and body["turn"] is None and body["round"] is None
    assert body["totals"]["steps"] == 0


def test_turns_in_order(admin, hal, jobs) -> None:
    job = started(jobs["ac"])
    turns = admin.get(f"/api/jobs/{job.pk}/turns/").json()["results"]
    assert [(t["round"], t["position"], t["status"]) for t in turns] == [
        (0, 0, "running"),
        (0, 1, "pending"),
    ]
    assert turns[0]["hospital"] == "st-marys" and turns[0]["bytes_up"] == 300
    error(hal.get(f"/api/jobs/{jobs['bc'].pk}/turns/"), 404, "not_found")


def test_metrics_filters(admin, hal, jobs, settings) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "METRICS_MIN_INTERVAL_SECONDS": 1.0}
    job = started(jobs["ac"])
    turn = job.turns.get(status="running")
    t0 = timezone.now() + timedelta(seconds=10)
    services.turn_record_progress(
        turn=turn, steps=9, samples=144, bytes_up=900, bytes_down=810, loss=0.4, at=t0
    )
    points = admin.get(f"/api/jobs/{job.pk}/metrics/").json()["results"]
    assert [p["step"] for p in points] == [3, 9] and points[1]["loss"] == 0.4
    since = (t0 - timedelta(seconds=1)).isoformat()
    later = admin.get(f"/api/jobs/{job.pk}/metrics/", {"turn": turn.pk, "since": since})
    assert [p["step"] for p in later.json()["results"]] == [9]
    assert error(admin.get(f"/api/jobs/{job.pk}/metrics/", {"since": "yesterday"}), 400, "invalid")[
        "since"
    ]
    other = jobs["bc"].pk
    details = error(admin.get(f"/api/jobs/{job.pk}/metrics/", {"turn": 10**6}), 400, "invalid")
    assert "has no turn" in details["turn"][0]
    error(admin.get(f"/api/jobs/{job.pk}/metrics/", {"turn": "x"}), 400, "invalid")
    error(hal.get(f"/api/jobs/{other}/metrics/"), 404, "not_found")


# -- transitions ------------------------------------------------------------------------


def test_admin_schedules_pauses_resumes_and_cancels(admin, jobs) -> None:
    job = jobs["ac"]
    response = admin.post(f"/api/jobs/{job.pk}/schedule/", {"reason": "go"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "scheduled"
    services.job_start(job=job)
    assert admin.post(f"/api/jobs/{job.pk}/pause/").json()["state"] == "paused"
    assert admin.post(f"/api/jobs/{job.pk}/resume/").json()["state"] == "running"
    body = admin.post(f"/api/jobs/{job.pk}/cancel/").json()
    assert body["state"] == "cancelled" and body["finished_at"]
    log = AuditEvent.objects.filter(job_id=job.pk).values_list("action", flat=True)
    assert [a for a in log if a.startswith("job.")] == [
        "job.created",
        "job.scheduled",
        "job.running",
        "job.paused",
        "job.running",
        "job.cancelled",
    ]


def test_an_illegal_transition_is_a_409_naming_both_states(admin, jobs) -> None:
    details = error(admin.post(f"/api/jobs/{jobs['ac'].pk}/pause/"), 409, "conflict")
    assert details == {"state": "draft", "requested": "paused"}
    assert Job.objects.get(pk=jobs["ac"].pk).state == "draft"


@pytest.mark.parametrize("action", ["schedule", "pause", "resume", "cancel"])
def test_only_consortium_admins_move_jobs(hal, olga, nora, jobs, action) -> None:
    own, other = jobs["ac"].pk, jobs["bc"].pk
    error(hal.post(f"/api/jobs/{own}/{action}/"), 403, "permission_denied")
    error(hal.post(f"/api/jobs/{other}/{action}/"), 404, "not_found")
    error(olga.post(f"/api/jobs/{own}/{action}/"), 403, "permission_denied")
    error(nora.post(f"/api/jobs/{own}/{action}/"), 403, "permission_denied")
    assert set(Job.objects.values_list("state", flat=True)) == {"draft"}


def test_transition_reason_is_checked(admin, jobs) -> None:
    response = admin.post(
        f"/api/jobs/{jobs['ac'].pk}/cancel/", {"reason": "x" * 3000}, format="json"
    )
    assert "reason" in error(response, 400, "invalid")


# -- the agent's view -------------------------------------------------------------------


def test_agent_sees_only_its_scheduled_and_running_jobs(agent_client, hospital_a, jobs) -> None:
    agent = agent_client(hospital_a)
    assert agent.get("/api/agent/assignments/").json() == []  # drafts are not assignments
    started(jobs["ac"])
    started(jobs["bc"])
    (assignment,) = agent.get("/api/agent/assignments/").json()
    assert assignment["job"] == jobs["ac"].pk and assignment["position"] == 0
    assert assignment["participant_count"] == 2
    # The job's one description, as stored; no field of it is repeated beside it.
    assert assignment["description"] == jobs["ac"].description
    assert JobDescription.from_json(assignment["description"]).cuts == ("pool1",)
    assert not {"cuts", "mode", "model", "seed", "client_optimizer"} & set(assignment)
    assert assignment["turn"]["status"] == "running" and assignment["turn"]["round"] == 0
    one = agent.get(f"/api/agent/assignments/{jobs['ac'].pk}/")
    assert one.status_code == 200 and one.json()["job"] == jobs["ac"].pk
    error(agent.get(f"/api/agent/assignments/{jobs['bc'].pk}/"), 404, "not_found")


def test_assignments_are_for_agents(admin, hal, jobs) -> None:
    error(admin.get("/api/agent/assignments/"), 403, "permission_denied")
    error(hal.get(f"/api/agent/assignments/{jobs['ac'].pk}/"), 403, "permission_denied")


def test_the_schema_is_valid_and_documents_the_job_api(admin) -> None:
    response = admin.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)
    for path in [
        "/api/jobs/",
        "/api/jobs/{job_id}/status/",
        "/api/jobs/{job_id}/metrics/",
        "/api/jobs/{job_id}/pause/",
        "/api/models/{name}/cuts/",
        "/api/agent/assignments/",
    ]:
        assert path in schema["paths"], path
    assert "JobInput" in str(schema["paths"]["/api/jobs/"]["post"]["requestBody"])
