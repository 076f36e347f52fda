"""A real demo (``scripts/demo.py``) as a newcomer meets it: started without
``--exit-when-done`` and without ``REDIS_URL`` (so it runs a redis-server of its own), a
U-shaped job of two rounds over three hospitals, the dashboard checked in Chromium while
the job runs and after it ends (issue 17's points, on the page), then Ctrl-C, which exits
0, leaves nothing behind and turns an open page's banner on.

One run (the module-scoped ``demo``) is shared by the tests below, one per point, in file
order: first those that need the job running, then (``finished``) those of the finished
job; the last one sends Ctrl-C. Page checks go between the first and the last tests.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from playwright.sync_api import expect

from tests.demo_run import QUICK, DemoRun, answers, still_running
from tests.frontend.conftest import assert_audit_row_reads_as_words, screenshot, sign_in
from tests.redis_server import DEFAULT_URL, reachable

pytestmark = pytest.mark.slow

ROUNDS = 2
#: U-shaped (the loss is the hospitals' own), two rounds of six local epochs: 42 steps a
#: turn on the synthetic thirds, long enough for the checks made while it runs (with two
#: epochs a quiet machine ended the job before the time-left check saw it running).
ARGS = (*QUICK, "--mode", "ushaped", "--rounds", str(ROUNDS), "--local-epochs", "6")
HOSPITALS = {"St Mary's": "st-marys", "City General": "city-general", "Northside": "northside"}
CHART = "Chart.getChart(document.querySelector('[data-testid={}]'))"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """The demo once its job runs, until the last test stops it."""
    run = DemoRun(tmp_path_factory.mktemp("demo") / "work", *ARGS, redis_url=None)
    try:
        run.wait_for("running, round 1", timeout=600)
        yield run
    finally:
        run.kill()


@pytest.fixture(scope="module")
def finished(demo: DemoRun) -> DemoRun:
    """The demo, up after its job ended."""
    demo.wait_for("Ctrl-C stops every process", timeout=600)
    return demo


@pytest.fixture(scope="module")
def own_redis(finished: DemoRun) -> tuple[str, Path]:
    """The URL and folder of the redis-server the demo started."""
    found = finished.found(r"Redis: started \S+ on port (\d+) in (\S+) \(REDIS_URL is not set\)")
    return f"redis://127.0.0.1:{found[1]}/0", Path(found[2])


def _open(browser, demo: DemoRun) -> tuple[object, object]:
    context = browser.new_context(base_url=demo.base_url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(15_000)
    page = context.new_page()
    sign_in(page, "admin", demo.password)
    return context, page


@pytest.fixture
def page(browser, demo: DemoRun) -> Iterator[object]:
    """A page of the demo's dashboard, signed in as the admin the demo made."""
    context, page = _open(browser, demo)
    yield page
    context.close()


@pytest.fixture(scope="module")
def open_overview(browser, demo: DemoRun) -> Iterator[object]:
    """The overview, opened while the job runs and left open (polling) until Ctrl-C."""
    context, page = _open(browser, demo)
    page.goto("/#/")
    yield page
    context.close()


def _job_id(demo: DemoRun) -> int:
    return int(demo.found(r"job (\d+): \d+ rounds")[1])


def _steps_per_round(demo: DemoRun) -> int:
    return int(demo.found(r"hospitals, (\d+) steps:")[1]) // ROUNDS


def test_while_it_runs_a_hospital_in_its_turn_shows_so_in_the_job_row_and_the_table(
    open_overview, demo: DemoRun
) -> None:
    page = open_overview
    job = _job_id(demo)
    # One snapshot of both (drawn from one read), taken once the row names a turn: the
    # same hospital in its turn in each, and its row in the table not "idle".
    seen = page.wait_for_function(
        """(job) => {
          const row = document.querySelector(`[data-testid=job-row-${job}]`)?.innerText || "";
          if (!row.includes("in its turn")) return null;
          const table = document.querySelector("[data-testid=overview-hospitals]");
          const inTurn = [...table.querySelectorAll("[data-testid^=in-turn-]")].map(
            (e) => e.dataset.testid.slice("in-turn-".length));
          const rows = Object.fromEntries(
            [...table.querySelectorAll("[data-testid^=hospital-row-]")].map(
              (e) => [e.dataset.testid.slice("hospital-row-".length), e.innerText]),
          );
          return { row, inTurn, rows };
        }""",
        arg=job,
        timeout=30_000,
    ).json_value()
    in_row = [slug for name, slug in HOSPITALS.items() if f"{name} in its turn" in seen["row"]]
    assert len(in_row) == 1 and seen["inTurn"] == in_row, seen
    assert "idle" not in seen["rows"][in_row[0]], seen
    others = [slug for slug in HOSPITALS.values() if slug != in_row[0]]
    assert all("in its turn" not in seen["rows"][slug] for slug in others), seen
    screenshot(page, "demo-overview-in-turn")


def test_while_it_runs_the_time_left_is_an_estimate_and_the_last_loss_a_number(
    page, demo: DemoRun
) -> None:
    page.goto(f"/#/jobs/{_job_id(demo)}")
    eta = page.get_by_test_id("job-eta")
    # The steps to go are known from the epochs and the hospitals' split sizes; their time
    # once the speed is measured over 10 s ("estimating…" before: a turn's first steps are
    # slow), which a short job may never reach.
    expect(eta).to_have_text(re.compile(r"^(about \d+ (s|min)|estimating…)$"), timeout=30_000)
    expect(eta.locator("xpath=..")).to_contain_text(
        re.compile(r"\d+ steps to go( at [0-9.]+ steps/s|; the speed is measured over \d+ s)")
    )
    assert "unknown" not in eta.locator("xpath=..").inner_text()
    # U-shaped: the loss the hospitals report, not "–".
    expect(page.get_by_test_id("job-loss")).to_have_text(re.compile(r"^\d+\.\d{4}$"))
    screenshot(page, "demo-job-running")


def test_a_signed_out_visit_logs_no_favicon_404_and_no_401(browser, demo: DemoRun) -> None:
    context = browser.new_context(base_url=demo.base_url)
    failures: list[str] = []
    context.on(
        "response", lambda r: failures.append(f"{r.status} {r.url}") if r.status >= 400 else 0
    )
    try:
        page = context.new_page()
        page.on("console", lambda m: failures.append(m.text) if m.type == "error" else 0)
        page.goto("/")
        page.wait_for_url(re.compile(r"#/sign-in$"))
        page.get_by_label("Username").wait_for()
        page.wait_for_load_state("networkidle")
        assert failures == [], "the sign-in page logs no 401 of /api/auth/me/, no favicon 404"
        with urllib.request.urlopen(f"{demo.base_url}/static/dashboard/favicon.svg") as icon:
            assert icon.status == 200
    finally:
        context.close()


def test_the_job_ends_with_its_results_beside_the_baseline(finished: DemoRun) -> None:
    demo = finished
    assert "medsplit demo | completed" in demo.lines
    done = demo.found(
        r"done in \d+ s: test accuracy [0-9.]+ \(majority-class baseline [0-9.]+\), "
        r"AUC [0-9.]+ \(chance 0.5\): the mean of the hospitals' figures weighted by their "
        r"test-set sizes \(not pooled\), over 3 hospitals"
    )
    # Then where the dashboard stays up, with the password to sign in again.
    after = demo.wait_for("the dashboard stays up:", timeout=5)
    assert demo.output.index(after) > done.end()
    assert f"{demo.base_url}/#/jobs/{_job_id(demo)}" in after and "password" in after
    assert demo.process.poll() is None, "still running after the job"


def test_the_dashboard_is_still_reachable_after_the_job(finished: DemoRun) -> None:
    demo = finished
    with urllib.request.urlopen(f"{demo.base_url}/", timeout=15) as response:
        assert response.status == 200
    stays = demo.wait_for("the dashboard stays up:", timeout=5)
    assert f"{demo.base_url}/#/jobs/{_job_id(demo)}" in stays


def test_the_dashboard_shows_the_finished_job(page, finished: DemoRun) -> None:
    page.goto(f"/#/jobs/{_job_id(finished)}")
    expect(page.get_by_test_id("job-state")).to_have_text(re.compile("completed", re.I))
    screenshot(page, "demo-job-finished")


def test_one_loss_curve_per_hospital_over_both_rounds_with_the_rounds_marked(
    page, finished: DemoRun
) -> None:
    page.goto(f"/#/jobs/{_job_id(finished)}")
    expect(page.get_by_test_id("job-state")).to_have_text(re.compile("completed", re.I))
    expect(page.get_by_test_id("loss-note")).to_contain_text("Each hospital computes its own loss")
    expect(page.get_by_test_id("loss-note")).to_contain_text("where each round starts")
    chart = page.evaluate(
        f"""() => {{
        const c = {CHART.format("loss-chart")};
        return {{
          curves: c.data.datasets.map((d) => d.data.map((p) => [p.x, p.y])),
          legend: c.legend.legendItems.map((i) => i.text),
          rounds: c.options.plugins.roundLines.starts.length,
        }};
      }}"""
    )
    assert chart["legend"] == list(HOSPITALS), chart["legend"]
    assert chart["rounds"] == ROUNDS
    per_round = _steps_per_round(finished)
    for name, points in zip(HOSPITALS, chart["curves"], strict=True):
        xs = [x for x, _ in points]
        assert xs == sorted(xs) and all(y > 0 for _, y in points), (name, points)
        # One curve over the job's steps: this hospital's turn in each round.
        assert min(xs) <= per_round < max(xs) <= ROUNDS * per_round, (name, xs, per_round)
    page.get_by_test_id("loss-chart").scroll_into_view_if_needed()
    screenshot(page, "demo-job-loss")


def test_the_finished_ushaped_job_shows_its_last_loss_units_and_definitions(
    page, finished: DemoRun
) -> None:
    page.goto(f"/#/jobs/{_job_id(finished)}")
    expect(page.get_by_test_id("job-state")).to_have_text(re.compile("completed", re.I))
    expect(page.get_by_test_id("job-loss")).to_have_text(re.compile(r"^\d+\.\d{4}$"))
    rate = page.get_by_test_id("job-rate").locator("xpath=..")
    expect(rate).to_contain_text("training steps per second over the last 60 s of progress")
    # Time left, once the job ended: said so, not "unknown".
    eta = page.get_by_test_id("job-eta").locator("xpath=..")
    expect(eta).to_contain_text("the job is completed")
    assert "unknown" not in eta.inner_text()
    bytes_x = page.evaluate(
        f"() => ({{ ticks: {CHART.format('bytes-chart')}.scales.x.ticks.map((t) => t.label),"
        f" title: {CHART.format('bytes-chart')}.options.scales.x.title.text }})"
    )
    ticks = bytes_x["ticks"]
    assert ticks and all(re.fullmatch(r"\d{1,2}:\d{2}:\d{2}( [AP]M)?", t) for t in ticks), ticks
    assert bytes_x["title"] == "time of day"


def test_validation_shows_accuracy_beside_the_baseline_and_train_loss_apart(
    page, finished: DemoRun
) -> None:
    page.goto(f"/#/jobs/{_job_id(finished)}")
    table = page.locator(".job-turns table")
    expect(table.locator("th", has_text="Train loss")).to_be_visible()
    cells = table.get_by_test_id("validation-cell")
    expect(cells).to_have_count(len(HOSPITALS) * ROUNDS)
    for i in range(len(HOSPITALS) * ROUNDS):
        expect(cells.nth(i)).to_contain_text(
            re.compile(r"accuracy [0-9.]+ \(majority class [0-9.]+\)")
        )
        assert "train" not in cells.nth(i).inner_text()


def test_the_audit_log_reads_as_words_with_the_json_on_demand(page, finished: DemoRun) -> None:
    page.goto("/#/audit?action=turn.finished")
    rows = page.get_by_test_id("audit-row")
    expect(rows).to_have_count(len(HOSPITALS) * ROUNDS)
    assert_audit_row_reads_as_words(rows.first, "crossed: up: activations", "bytes up: ")
    screenshot(page, "demo-audit")


def test_its_own_redis_holds_the_runs_keys_and_the_shared_one_none(
    finished: DemoRun, own_redis: tuple[str, Path]
) -> None:
    demo = finished
    url, folder = own_redis
    assert url != DEFAULT_URL and folder.is_dir()
    prefix = demo.prefix
    own = redis.Redis.from_url(url, socket_timeout=10)
    try:
        assert any(k.startswith(f"{prefix}:".encode()) for k in own.scan_iter(count=1000))
        users = [u.decode() for u in own.execute_command("ACL", "USERS")]
        assert len([u for u in users if u.startswith(f"{prefix}-hospital-")]) == 3
    finally:
        own.close()
    if not reachable(DEFAULT_URL):
        return  # no Redis on 6379 to have been written to
    shared = redis.Redis.from_url(DEFAULT_URL, socket_timeout=10)
    try:
        assert list(shared.scan_iter(match=f"*{prefix}*", count=1000)) == []
        assert [u for u in shared.execute_command("ACL", "USERS") if prefix.encode() in u] == []
    finally:
        shared.close()


def test_ctrl_c_stops_everything_and_an_open_page_says_the_coordinator_is_away(
    finished: DemoRun, own_redis: tuple[str, Path], open_overview
) -> None:
    demo = finished
    url, folder = own_redis
    banner = open_overview.get_by_test_id("coordinator-unreachable")
    expect(banner).to_be_hidden()
    assert demo.interrupt() == 0, demo.output
    assert "stopping (Ctrl-C)" in demo.output and "every process stopped" in demo.output
    assert still_running(demo.work) == []
    assert not answers(url), "its redis-server is gone"
    assert not folder.exists(), "and so is its folder"
    # The overview, open since the job ran, says so in words at its next poll.
    expect(banner).to_be_visible(timeout=15_000)
    expect(banner).to_contain_text(f"The coordinator at {demo.base_url} is not answering")
    assert "Failed to fetch" not in open_overview.inner_text("body")
    screenshot(open_overview, "demo-coordinator-away")
