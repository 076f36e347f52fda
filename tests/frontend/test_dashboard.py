"""The dashboard in a real browser (Playwright + Chromium, headless) against the live
coordinator: sign in, register and approve hospitals, create a job, watch a running job's
progress change, filter the audit log, and roles. Each page is saved as a picture in a
temporary folder, or in docs/screenshots/ by `scripts/screenshots`.
"""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from audit.models import AuditEvent
from hospitals import services as hospital_services
from kernel.actors import Actor, ActorKind
from medsplit.protocol.keys import (
    fingerprint,
    format_fingerprint,
    generate_identity_key,
    identity_public_b64,
)
from medsplit.training.verify import deterministic
from tests.frontend.conftest import screenshot, sign_in
from tests.security import test_least_privilege as least_privilege
from tests.security.test_least_privilege import failed_job
from tests.workers.hospitals import Hospitals, local_data, report_sizes
from tests.workers.processes import Processes, processes, wait_until
from training import services
from training.aggregation import aggregation_submit
from training.models import Aggregation, Job, Turn
from training.states import JobState

__all__ = ["failed_job", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_sign_in_shows_the_overview_and_a_wrong_password_says_so(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    page.goto("/")
    page.wait_for_url(re.compile(r"#/sign-in$"))
    page.get_by_label("Username").fill(consortium_admin.username)
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text=re.compile("password|credentials", re.I)).wait_for()
    sign_in(page, consortium_admin.username)
    page.get_by_role("heading", level=1).first.wait_for()
    for hospital in three_hospitals:
        page.get_by_text(hospital.name).first.wait_for()
    screenshot(page, "overview")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"#/sign-in$"))


def test_register_a_hospital_and_approve_a_join_request(open_page, consortium_admin) -> None:
    requested = hospital_services.hospital_join_request(
        name=f"Riverside {uuid.uuid4().hex[:4]}", contact_email="it@riverside.example"
    )
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/hospitals")
    form = page.get_by_test_id("register-form")
    form.get_by_label("Name").fill("Lakeside Hospital")
    form.get_by_role("button").click()
    code = page.get_by_test_id("enrolment-code")
    code.wait_for()
    assert re.search(r"msc_\w+", code.inner_text())
    page.get_by_test_id(f"approve-{requested.slug}").click()
    shown = page.get_by_role("region", name="Enrolment code").filter(has_text=requested.name)
    assert "msc_" in shown.get_by_test_id("enrolment-code").inner_text()
    wait_until("the approval to be stored", lambda: _status(requested) == "approved", 10)
    page.goto("/#/hospitals")
    page.get_by_test_id(f"hospital-row-{requested.slug}").wait_for()
    screenshot(page, "hospitals")


def _status(hospital) -> str:
    hospital.refresh_from_db()
    return hospital.status


def test_create_a_job_from_the_form(open_page, consortium_admin, three_hospitals) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    model = form.get_by_label(re.compile("^Model", re.I))
    model.select_option("small_cnn")
    for hospital in three_hospitals:
        page.get_by_test_id(f"participant-{hospital.slug}").check()
    # The cut table is computed by the coordinator for the model and the hospitals' shape.
    page.get_by_test_id("cut-pool1").check(timeout=60_000)
    # The turn order is the order of the participants' rows (moved with their buttons).
    shown = page.locator("[data-testid^='participant-']").evaluate_all(
        "nodes => nodes.map(n => n.dataset.testid.slice('participant-'.length))"
    )
    screenshot(page, "new-job")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    job = Job.objects.get(pk=job_id)
    assert job.model_name == "small_cnn" and job.description["cuts"] == ["pool1"]
    order = [p.hospital.slug for p in job.participants.order_by("position")]
    assert order == [slug for slug in shown if slug in order]
    assert set(order) == {h.slug for h in three_hospitals}


def test_a_splitfed_job_from_the_form_and_its_secure_aggregation_on_the_job_page(
    open_page, consortium_admin, three_hospitals
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    form.locator("select[name=mode]").select_option(label="SplitFed (SFLV1, labels at home)")
    for hospital in three_hospitals:
        page.get_by_test_id(f"participant-{hospital.slug}").check()
    # Two cuts, as U-shaped takes: its default cuts are ticked.
    expect(page.get_by_test_id("cut-pool")).to_be_checked(timeout=60_000)
    form.locator("input[name=round_deadline_seconds]").fill("600")
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    described = job.description
    assert (described["mode"], described["mode_options"]) == (
        "splitfed",
        {"variant": "v1", "labels": "hospital"},
    )
    assert len(described["cuts"]) == 2
    assert job.round_deadline_seconds == 600

    # Its first round ended and two of three hospitals have submitted their masked fronts.
    Job.objects.filter(pk=job.pk).update(state=JobState.SCHEDULED)
    services.job_start(job=job)
    Turn.objects.filter(job=job).update(status=Turn.Status.COMPLETED)
    services.group_start_next(job=job)
    assert Aggregation.objects.get(job=job).weights.keys() == {h.slug for h in three_hospitals}
    for hospital in three_hospitals[:2]:
        aggregation_submit(
            actor=Actor(ActorKind.HOSPITAL, hospital=hospital),
            job_id=job.pk,
            round_index=0,
            attempt=0,
            sha256="ab" * 32,
            size_bytes=2048,
            counts={},
        )
    box = page.get_by_test_id("aggregations")
    expect(box).to_contain_text("2 of 3", timeout=30_000)
    expect(box).to_contain_text("collecting")
    screenshot(page, "splitfed-aggregation")


def test_the_form_takes_its_modes_codecs_and_optimizers_from_the_coordinator(
    open_page, consortium_admin, three_hospitals
) -> None:
    """The mode choices, their help and how many cuts each takes come from GET /api/modes/;
    the codecs from GET /api/codecs/, the optimizers and their options from
    GET /api/optimizers/."""
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/jobs/new")
    form = page.get_by_test_id("job-form")
    form.wait_for()
    form.get_by_label(re.compile("^Model", re.I)).select_option("small_cnn")
    mode = form.locator("select[name=mode]")
    options = mode.locator("option").evaluate_all("nodes => nodes.map(n => [n.value, n.text])")
    # SplitFed and vertical are offered once per configuration the platform runs
    # (GET /api/modes/ lists them, each with runs_on_platform).
    assert options == [
        ["vanilla", "Vanilla"],
        ["ushaped", "U-shaped"],
        ['splitfed:{"variant":"v1","labels":"server"}', "SplitFed (SFLV1, labels at the server)"],
        ['splitfed:{"variant":"v1","labels":"hospital"}', "SplitFed (SFLV1, labels at home)"],
        ['splitfed:{"variant":"v2","labels":"server"}', "SplitFed (SFLV2, labels at the server)"],
        ['splitfed:{"variant":"v2","labels":"hospital"}', "SplitFed (SFLV2, labels at home)"],
        *[
            [f'vertical:{{"join":"{join}","labels":"{labels}"}}', f"Vertical ({join}, labels {at})"]
            for join in ("sum", "mean", "concat")
            for labels, at in (("hospital", "at home"), ("server", "at the server"))
        ],
    ]
    codecs = form.locator("select[name=codec] option")
    assert codecs.evaluate_all("nodes => nodes.map(n => [n.value, n.text])") == [
        ["none", "none (exact)"],
        ["fp16", "fp16"],
        ["bf16", "bf16"],
        ["int8", "int8"],
    ]
    client = form.locator("select[name=client_opt_name]")
    names = client.locator("option").evaluate_all("nodes => nodes.map(n => n.value)")
    assert names == ["sgd", "adam", "adamw"]
    expect(form.locator("input[name=client_opt_momentum]")).to_be_visible()
    client.select_option("adam")  # Adam reads no momentum: its field goes
    expect(form.locator("input[name=client_opt_momentum]")).to_be_hidden()
    for hospital in three_hospitals:
        page.get_by_test_id(f"participant-{hospital.slug}").check()
    page.get_by_test_id("cut-pool1").wait_for(timeout=60_000)
    mode.select_option("ushaped")
    expect(
        page.get_by_text("the hospital also keeps the last layers and the labels")
    ).to_be_visible()
    expect(page.get_by_text(re.compile(r"U-shaped: tick two cuts\."))).to_be_visible()
    # Two boxes, the model's default pair ticked (GET /api/models/: default_cuts by mode).
    expect(page.get_by_test_id("cut-pool1")).to_be_checked()
    expect(page.get_by_test_id("cut-pool")).to_be_checked()
    page.get_by_test_id("create-job").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job = Job.objects.get(pk=int(page.url.rsplit("/", 1)[1]))
    assert job.mode == "ushaped" and job.description["cuts"] == ["pool1", "pool"]
    assert job.description["client_optimizer"]["name"] == "adam"


def test_the_job_page_follows_a_running_job(
    open_page, processes: Processes, redis_url: str, consortium_admin, admin_actor: Actor, make_job
) -> None:
    processes.celery_worker("worker")
    processes.celery_beat()
    job = make_job(seed=uuid.uuid4().int % 1000, rounds=2, max_steps_per_turn=40, batch_size=8)
    train, val = local_data(job, 8 * 40), local_data(job, 16)
    # The hospitals report their split sizes before the job starts: the worker checks
    # their frames against them (tests/security/test_hostile_frames.py).
    report_sizes(job, train, val)
    job = services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    steps = page.get_by_test_id("job-steps")
    with deterministic():
        # Slowed (240 steps of a few ms each): a job that completed before the click
        # cannot be paused (409).
        hospitals = Hospitals(job, redis_url, train, val, send_delay=0.02).start()
        seen = set()

        def moving() -> bool:
            text = steps.inner_text()
            if text.strip().isdigit():
                seen.add(int(text))
            return len(seen) >= 3

        wait_until("the job page to show progress changing", moving, 120, processes)
        screenshot(page, "job")
        page.get_by_test_id("pause").click()
        expect(page.get_by_test_id("job-state")).to_contain_text("paus")
        page.get_by_test_id("job-state").filter(has_text="paused").wait_for()
        page.get_by_test_id("resume").click()
        page.get_by_test_id("job-state").filter(has_text=re.compile("running|completed")).wait_for()
        wait_until("the job to complete", lambda: _done(job), 240, processes)
        page.get_by_test_id("job-state").filter(has_text="completed").wait_for(timeout=30_000)
        hospitals.join(60)
    # One loss curve per hospital, over both rounds (the worker's losses).
    curves = page.evaluate(
        "() => Chart.getChart(document.querySelector('[data-testid=loss-chart]'))"
        ".data.datasets.map((d) => d.data.map((p) => p.x))"
    )
    assert len(curves) == 3 and all(xs for xs in curves), curves
    assert max(curves[0]) > 3 * 40, "the first hospital's curve reaches into round 2"
    assert AuditEvent.objects.filter(job_id=job.pk, action="job.paused").exists()


def test_the_job_page_shows_a_factory_models_arguments(
    open_page, consortium_admin, make_job
) -> None:
    from tests.model_modules import ARGS, listed
    from training.apps import MODEL_MODULES_SETTING

    with listed(["medsplit.models"], setting=MODEL_MODULES_SETTING):
        job = make_job(model="medsplit.models.small_cnn:small_cnn", model_args=ARGS)
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    row = page.locator("tr", has_text="Model arguments")
    expect(row).to_contain_text('"spatial_dims":2')
    expect(page.locator("tr", has_text="Model").first).to_contain_text("small_cnn:small_cnn")


def _done(job: Job) -> bool:
    job.refresh_from_db()
    assert job.state not in (JobState.FAILED, JobState.CANCELLED), job.state_reason
    return job.state == JobState.COMPLETED


def test_filter_the_audit_log(open_page, consortium_admin, three_hospitals, make_job) -> None:
    make_job()
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/audit")
    page.get_by_test_id("chain-status").filter(has_text=re.compile("verif", re.I)).wait_for()
    filters = page.get_by_test_id("audit-filters")
    filters.get_by_label(re.compile("^Action", re.I)).fill("job.created")
    filters.get_by_role("button", name=re.compile("filter|apply|search", re.I)).click()
    page.wait_for_url(re.compile(r"action=job\.created"))
    rows = page.get_by_test_id("audit-row")
    # Auto-waiting: the table is replaced once the filtered answer arrives.
    expect(rows).to_have_count(AuditEvent.objects.filter(action="job.created").count())
    for i in range(rows.count()):
        expect(rows.nth(i)).to_contain_text("job.created")
    assert "action=job.created" in page.get_by_test_id("export-csv").get_attribute("href")
    screenshot(page, "audit")


def test_a_hospital_admin_sees_only_their_own_hospital(
    open_page, hospital_admin, hospital_a, hospital_b
) -> None:
    identity = generate_identity_key()
    hospital_a.identity_key = identity_public_b64(identity)
    hospital_a.identity_fingerprint = fingerprint(identity)
    hospital_a.identity_generation = 1
    hospital_a.save()
    page = open_page()
    sign_in(page, hospital_admin.username)
    page.goto("/#/hospitals")
    page.get_by_test_id(f"hospital-row-{hospital_a.slug}").wait_for()
    assert page.get_by_test_id(f"hospital-row-{hospital_b.slug}").count() == 0
    page.goto(f"/#/hospitals/{hospital_a.slug}")
    page.get_by_role("heading", name=re.compile(hospital_a.name)).wait_for()
    # The fingerprint as `medsplit-agent status` prints it at the hospital, to compare.
    expect(page.get_by_test_id("identity-fingerprint")).to_have_text(
        format_fingerprint(fingerprint(identity))
    )
    screenshot(page, "hospital")
    page.goto(f"/#/hospitals/{hospital_b.slug}")
    page.get_by_role("heading", name="Not found").wait_for()
    assert hospital_b.name not in page.inner_text("main")
    assert page.get_by_role("link", name="New job").count() == 0


def test_a_hospital_admin_sees_the_others_part_of_a_job_as_names_states_and_samples(
    open_page, hospital_admin, failed_job
) -> None:
    """The job page works with the fields the API leaves out of other hospitals' turns
    (kernel/permissions.py): dashes where they would be, and none of their data."""
    page = open_page()
    sign_in(page, hospital_admin.username)
    page.goto(f"/#/jobs/{failed_job.pk}")
    page.get_by_test_id("job-state").filter(has_text="failed").wait_for()
    turns = page.locator(".job-turns table")
    theirs = turns.locator("tr", has_text="City General")
    mine = turns.locator("tr", has_text="St Marys")
    expect(theirs).to_contain_text("640")  # their sample count
    expect(mine).to_contain_text("val accuracy")
    text = page.inner_text("main")
    assert not re.search(r"\b(NaN|undefined|null)\b", text), text
    for secret in least_privilege.SECRETS:
        assert secret not in text
    assert "its reason is shown to city-general" in text
    screenshot(page, "job-hospital-admin")
