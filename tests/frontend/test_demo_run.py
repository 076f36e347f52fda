"""A real demo (``scripts/demo.py``) as a newcomer meets it: started without
``--exit-when-done`` and without ``REDIS_URL`` (so it runs a redis-server of its own), its
job run to the end, the dashboard still up in Chromium showing the finished job, then
Ctrl-C, which exits 0 and leaves nothing behind.

One run (the module-scoped ``demo``) is shared by the tests below, one per point, in file
order; the last one sends Ctrl-C. Page checks go between the first and the last tests.
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
from tests.frontend.conftest import screenshot, sign_in
from tests.redis_server import DEFAULT_URL, reachable

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """The demo, up after its (quick) job, until the last test stops it."""
    run = DemoRun(tmp_path_factory.mktemp("demo") / "work", *QUICK, redis_url=None)
    try:
        run.wait_for("Ctrl-C stops every process", timeout=600)
        yield run
    finally:
        run.kill()


@pytest.fixture(scope="module")
def own_redis(demo: DemoRun) -> tuple[str, Path]:
    """The URL and folder of the redis-server the demo started."""
    found = demo.found(r"Redis: started \S+ on port (\d+) in (\S+) \(REDIS_URL is not set\)")
    return f"redis://127.0.0.1:{found[1]}/0", Path(found[2])


@pytest.fixture
def page(browser, demo: DemoRun) -> Iterator[object]:
    """A page of the demo's dashboard, signed in as the admin the demo made."""
    context = browser.new_context(base_url=demo.base_url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(15_000)
    page = context.new_page()
    sign_in(page, "admin", demo.password)
    yield page
    context.close()


def test_the_job_ends_with_its_results_beside_the_baseline(demo: DemoRun) -> None:
    assert "medsplit demo | completed" in demo.lines
    demo.found(r"test accuracy [0-9.]+ \(majority-class baseline [0-9.]+ \(always class \d\)\)")
    assert demo.process.poll() is None, "still running after the job"


def test_the_dashboard_is_still_reachable_after_the_job(demo: DemoRun) -> None:
    with urllib.request.urlopen(f"{demo.base_url}/", timeout=15) as response:
        assert response.status == 200
    stays = demo.wait_for("the dashboard stays up:", timeout=5)
    assert f"{demo.base_url}/#/jobs/1" in stays


def test_the_dashboard_shows_the_finished_job(page, demo: DemoRun) -> None:
    page.goto("/#/jobs/1")
    expect(page.get_by_test_id("job-state")).to_have_text(re.compile("completed", re.I))
    screenshot(page, "demo-job-finished")


def test_its_own_redis_holds_the_runs_keys_and_the_shared_one_none(
    demo: DemoRun, own_redis: tuple[str, Path]
) -> None:
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


def test_ctrl_c_stops_everything_with_exit_code_0(
    demo: DemoRun, own_redis: tuple[str, Path]
) -> None:
    url, folder = own_redis
    assert demo.interrupt() == 0, demo.output
    assert "stopping (Ctrl-C)" in demo.output and "every process stopped" in demo.output
    assert still_running(demo.work) == []
    assert not answers(url), "its redis-server is gone"
    assert not folder.exists(), "and so is its folder"
