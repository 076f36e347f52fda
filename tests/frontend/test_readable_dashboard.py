"""The dashboard as an administrator lives with it (issue 17), in Chromium against the live
coordinator: a coordinator that stops answering is said in words, loss curves stay readable
at 20 rounds and 10 hospitals, U-shaped jobs show the hospital's loss, the units are human,
time left is estimated from the split sizes, a hospital in its turn shows so everywhere,
audit details read as words, accuracies come with their majority-class baseline, and a
signed-out visit logs no error.

Most tests share one job put together through the training services (no worker or agent
runs: they are quick); the coordinator-unreachable test runs the coordinator as its own
process and stops it under the page.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.utils import timezone
from playwright.sync_api import expect

from hospital_agent.coordinator import Coordinator
from hospitals.models import Hospital
from tests.frontend.conftest import assert_audit_row_reads_as_words, screenshot, sign_in
from tests.platform_apps.conftest import PASSWORD, issue_agent_token, make_hospital
from tests.workers.processes import processes
from training import services
from training.models import Job, MetricPoint, Round, Turn

__all__ = ["processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 5  # a turn: 40 training samples (the fixtures' summaries), batch 8
CROSSED = {
    "up": {"activations": {"pool1": "float32"}, "labels": {"labels": "int64"}},
    "down": {"gradients": {"pool1": "float32"}},
}
METRICS = {
    "train_loss": 0.61,
    "val_accuracy": 0.75,
    "val_loss": 0.52,
    "val_auc": 0.81,
    "val_samples": 20,
}
# The fixtures' hospitals report labels {"0": 10, "1": 11}: always answering "1" is right
# 11 times in 21.
MAJORITY = f"{11 / 21:.3f}"


def _play_turn(turn: Turn, start, *, steps: int = STEPS, finish: bool = True) -> None:
    for step in range(1, steps + 1):
        services.turn_record_progress(
            turn=turn, steps=step, samples=8 * step, bytes_up=40_000 * step,
            bytes_down=36_000 * step, loss=1.0 / step + 0.1 * turn.position, final=True,
            at=start + timedelta(seconds=2 * step),
        )  # fmt: skip
    if finish:
        services.turn_finish(turn=turn, metrics=METRICS, crossed=CROSSED)


@pytest.fixture
def job_mid_run(make_job, three_hospitals) -> Job:
    """Two rounds of three hospitals: round 1 done, round 2's first turn done and its
    second running (two steps in); the hospitals' agents last said "idle"."""
    Hospital.objects.filter(pk__in=[h.pk for h in three_hospitals]).update(agent_status="idle")
    job = make_job(rounds=2, max_steps_per_turn=None, batch_size=8, name="pneumonia")
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    start = timezone.now() - timedelta(seconds=80)
    turn = services.turn_start_next(job=job)
    for _ in range(4):
        _play_turn(turn, start)
        start += timedelta(seconds=2 * STEPS + 2)
        turn = services.turn_start_next(job=job)
    _play_turn(turn, start, steps=2, finish=False)
    return job


def test_a_coordinator_that_stops_answering_is_said_in_words_and_the_job_page_freezes(
    open_page, coordinator_process, consortium_admin, job_mid_run
) -> None:
    # The coordinator's own process checks passwords with its own (production) hasher.
    consortium_admin.password = PBKDF2PasswordHasher().encode(PASSWORD, "saltysaltysalt")
    consortium_admin.save(update_fields=["password"])
    page = open_page(coordinator_process.url)
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job_mid_run.pk}")
    updated = page.get_by_test_id("job-updated")
    expect(updated).to_contain_text("Updated")
    banner = page.get_by_test_id("coordinator-unreachable")
    expect(banner).to_be_hidden()

    coordinator_process.stop()
    expect(banner).to_be_visible(timeout=10_000)
    expect(banner).to_contain_text(
        f"The coordinator at {coordinator_process.url} is not answering; retrying"
    )
    expect(updated).to_contain_text("Frozen")
    screenshot(page, "job-coordinator-away")
    # Every page says so, and none says "Failed to fetch".
    for where in ("#/", "#/hospitals", "#/audit"):
        page.evaluate(f"window.location.hash = '{where}'")
        expect(banner).to_be_visible()
        page.wait_for_timeout(300)
        assert "Failed to fetch" not in page.inner_text("body")
    # Back: the banner goes by itself, and the pages update again.
    page.evaluate(f"window.location.hash = '#/jobs/{job_mid_run.pk}'")
    coordinator_process.start()
    expect(banner).to_be_hidden(timeout=15_000)
    expect(page.get_by_test_id("job-updated")).to_contain_text("Updated", timeout=10_000)


def _ten_hospitals_twenty_rounds(job_data, admin_actor) -> Job:
    """A finished job of 10 hospitals and 20 rounds, its rows written directly (quick)."""
    summary = {
        "image_shape": [1, 28, 28],
        "label_counts": {"0": 10, "1": 11},
        "split_sizes": {"train": 40, "val": 10},
    }
    hospitals = [make_hospital(f"site-{i:02d}", dataset_summary=summary) for i in range(10)]
    job = services.job_create(
        actor=admin_actor,
        data=job_data(
            rounds=20,
            max_steps_per_turn=None,
            batch_size=8,
            participants=[{"hospital": h.slug} for h in hospitals],
        ),
    )
    now = timezone.now()
    rounds = Round.objects.bulk_create(
        Round(job=job, index=r, status="completed", started_at=now) for r in range(20)
    )
    done = {"status": "completed", "steps": STEPS, "samples": 8 * STEPS, "metrics": METRICS}
    turns = Turn.objects.bulk_create(
        Turn(job=job, round=rounds[r], hospital=h, position=p, group=p, **done)
        for r in range(20)
        for p, h in enumerate(hospitals)
    )
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job,
            turn=t,
            step=s,
            time=now + timedelta(seconds=i),
            loss=2.0 / (1 + t.round.index) + 0.05 * t.position + 0.01 * s,
        )
        for i, t in enumerate(turns)
        for s in range(1, STEPS + 1)
    )
    Job.objects.filter(pk=job.pk).update(state="completed", current_round=19, finished_at=now)
    return job


def test_loss_curves_are_one_per_hospital_with_rounds_marked_at_20_rounds_and_10_hospitals(
    open_page, consortium_admin, job_data, admin_actor
) -> None:
    job = _ten_hospitals_twenty_rounds(job_data, admin_actor)
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    expect(page.get_by_test_id("job-state")).to_have_text("completed")
    expect(page.get_by_test_id("loss-note")).to_contain_text("where each round starts")
    chart = page.evaluate(
        """() => {
        const c = Chart.getChart(document.querySelector('[data-testid=loss-chart]'));
        const box = c.canvas.getBoundingClientRect();
        return {
          sets: c.data.datasets.map((d) => d.data.length),
          xs: c.data.datasets[0].data.map((p) => p.x),
          rounds: c.options.plugins.roundLines.starts.length,
          legend: c.legend.legendItems.map((i) => i.text),
          boxes: c.legend.legendHitBoxes.map((b) => [b.left, b.top, b.width, b.height]),
          width: box.width, height: box.height, legendHeight: c.legend.height,
        };
      }"""
    )
    # One continuous curve per hospital (its 20 turns, 5 steps each), not 200 pieces.
    assert chart["sets"] == [20 * STEPS] * 10
    assert chart["xs"][:STEPS] == [1, 2, 3, 4, 5] and chart["xs"][STEPS] == 10 * STEPS + 1
    assert chart["rounds"] == 20
    assert chart["legend"] == [f"Site {i:02d}" for i in range(10)]
    # Every legend entry drawn inside the canvas, and the legend leaves room for the plot.
    assert len(chart["boxes"]) == 10
    for left, top, width, height in chart["boxes"]:
        assert left >= 0 and left + width <= chart["width"] and top + height <= chart["height"]
    assert chart["legendHeight"] < chart["height"] / 3
    page.get_by_test_id("loss-chart").scroll_into_view_if_needed()
    screenshot(page, "job-loss-20-rounds")


def test_a_ushaped_job_shows_the_loss_its_hospitals_report(
    open_page, live_server, consortium_admin, make_job, hospital_a
) -> None:
    job = make_job(mode="ushaped", cuts=["pool1", "pool"], rounds=1, max_steps_per_turn=None)
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    agent = Coordinator(live_server.url, token=issue_agent_token(hospital_a))
    start = timezone.now() - timedelta(seconds=10)
    for step in (1, 2):
        # The agent's own call (hospital_agent/loss_report.py sends it), then the worker's
        # progress, which has no loss of its own in U-shaped mode.
        agent.report_loss(job=job.pk, turn=turn.pk, step=step, loss=0.9 / step)
        services.turn_record_progress(
            turn=turn, steps=step, samples=16 * step, bytes_up=step, bytes_down=step,
            loss=None, final=True, at=start + timedelta(seconds=step),
        )  # fmt: skip
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job.pk}")
    expect(page.get_by_test_id("job-loss")).to_have_text("0.4500")
    expect(page.get_by_test_id("loss-note")).to_contain_text("Each hospital computes its own loss")
    points = page.evaluate(
        "() => Chart.getChart(document.querySelector('[data-testid=loss-chart]'))"
        ".data.datasets[0].data.map((p) => [p.x, p.y])"
    )
    assert points == [[1, pytest.approx(0.9)], [2, pytest.approx(0.45)]]


def test_units_are_human_and_time_left_comes_from_the_split_sizes(
    open_page, consortium_admin, job_mid_run
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job_mid_run.pk}")
    # 6 places of 5 steps each: 4 done, the running one 2 steps in: 8 to go.
    eta = page.get_by_test_id("job-eta")
    expect(eta).to_have_text(re.compile(r"^about \d+ s$"))
    expect(eta.locator("xpath=..")).to_contain_text("8 steps to go")
    rate = page.get_by_test_id("job-rate").locator("xpath=..")
    expect(rate).to_contain_text("over the last 60 s of progress")
    ticks = page.evaluate(
        "() => Chart.getChart(document.querySelector('[data-testid=bytes-chart]'))"
        ".scales.x.ticks.map((t) => t.label)"
    )
    assert ticks and all(re.fullmatch(r"\d{1,2}:\d{2}:\d{2}( [AP]M)?", t) for t in ticks), ticks
    title = page.evaluate(
        "() => Chart.getChart(document.querySelector('[data-testid=bytes-chart]'))"
        ".options.scales.x.title.text"
    )
    assert title == "time of day"


def test_a_hospital_in_its_turn_shows_so_everywhere(
    open_page, consortium_admin, job_mid_run, three_hospitals
) -> None:
    running = job_mid_run.turns.get(status="running").hospital
    assert Hospital.objects.get(pk=running.pk).agent_status == "idle"  # its last heartbeat
    page = open_page()
    sign_in(page, consortium_admin.username)
    row = page.get_by_test_id(f"job-row-{job_mid_run.pk}")
    expect(row).to_contain_text(f"{running.name} in its turn")
    overview = page.get_by_test_id("overview-hospitals")
    expect(overview.get_by_test_id(f"in-turn-{running.slug}")).to_contain_text(
        "in its turn pneumonia, round 2"
    )
    expect(overview.get_by_test_id(f"hospital-row-{running.slug}")).not_to_contain_text("idle")
    others = [h for h in three_hospitals if h != running]
    expect(overview.get_by_test_id(f"hospital-row-{others[0].slug}")).to_contain_text("idle")
    screenshot(page, "overview-in-turn")
    page.goto("/#/hospitals")
    expect(page.get_by_test_id(f"in-turn-{running.slug}")).to_be_visible()
    page.goto(f"/#/hospitals/{running.slug}")
    expect(page.get_by_test_id("hospital-details")).to_contain_text("in its turn")


def test_audit_details_read_as_words_with_the_json_on_demand(
    open_page, consortium_admin, job_mid_run
) -> None:
    page = open_page()
    sign_in(page, consortium_admin.username)
    page.goto("/#/audit?action=turn.finished")
    assert_audit_row_reads_as_words(
        page.get_by_test_id("audit-row").first,
        "crossed: up: activations (pool1); labels (labels)",
        "bytes up: 195.3 KiB",
        "metrics: train loss 0.6100, val accuracy 0.7500",
    )
    screenshot(page, "audit-details")


def test_validation_has_its_baseline_and_a_signed_out_visit_logs_no_error(
    open_page, consortium_admin, job_mid_run
) -> None:
    page = open_page()
    failures: list[str] = []
    page.on("response", lambda r: failures.append(f"{r.status} {r.url}") if r.status >= 400 else 0)
    page.on("console", lambda m: failures.append(m.text) if m.type == "error" else 0)
    page.goto("/")
    page.wait_for_url(re.compile(r"#/sign-in$"))
    page.get_by_label("Username").wait_for()
    assert failures == [], "the sign-in page logs no 401 of /api/auth/me/, no favicon 404"
    sign_in(page, consortium_admin.username)
    page.goto(f"/#/jobs/{job_mid_run.pk}")
    table = page.locator(".job-turns table")
    expect(table.locator("th", has_text="Train loss")).to_be_visible()
    cell = table.get_by_test_id("validation-cell").first
    expect(cell).to_contain_text(f"accuracy 0.750 (majority class {MAJORITY})")
    expect(cell).to_contain_text("AUC 0.810")
    assert "train" not in cell.inner_text()
    baseline = page.evaluate(
        "() => Chart.getChart(document.querySelector('[data-testid=validation-chart]'))"
        ".data.datasets[1].data.map((p) => p.y)"
    )
    assert baseline and all(abs(y - 11 / 21) < 1e-9 for y in baseline)
    assert failures == [], failures
