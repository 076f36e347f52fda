"""Browser tests of the dashboard: Playwright driving Debian's Chromium, headless,
against the coordinator as a live server."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.platform_apps.conftest import (
    PASSWORD,
    _fast_passwords,
    _flushable_audit_log,
    admin_actor,
    consortium_admin,
    hospital_a,
    hospital_admin,
    hospital_b,
)
from tests.platform_apps.training.conftest import (
    hospital_c,
    job_data,
    make_job,
    three_hospitals,
)
from tests.redis_server import redis_url

__all__ = [
    "_fast_passwords",
    "_flushable_audit_log",
    "admin_actor",
    "consortium_admin",
    "hospital_a",
    "hospital_admin",
    "hospital_b",
    "hospital_c",
    "job_data",
    "make_job",
    "redis_url",
    "three_hospitals",
]

# Playwright's synchronous API runs an event loop in this thread; the test's own ORM
# calls are still synchronous, so Django may allow them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("MEDSPLIT_CHROMIUM", "/usr/bin/chromium")
#: Where the pages are saved. The tests write only to temporary places; `scripts/screenshots`
#: points this at docs/screenshots/ to refresh the README's pictures.
SCREENSHOTS_ENV = "MEDSPLIT_SCREENSHOTS_DIR"
_screenshots: dict[str, Path] = {}
VENDOR = Path(__file__).resolve().parents[2] / "frontend" / "vendor" / "chart.umd.min.js"


#: The cut tables this session's tests had the coordinator work out, by cache key.
_kept_cut_tables: dict[str, object] = {}


def _default_cut_table_keys() -> list[str]:
    """The cache keys of every registry model's table at its own shape: what the new-job
    form asks for when it opens (training/validation.py's ``model_cut_table`` keys)."""
    from medsplit.models.registry import get_model_spec, model_names

    keys = []
    for name in model_names():
        shape = ",".join(map(str, get_model_spec(name).default_input_shape))
        keys.append(f"cut-table:{name}:{shape}:default")
    return keys


@pytest.fixture(autouse=True)
def _cut_tables_kept(_fresh_cache) -> Iterator[None]:
    """Each test starts with an empty cache (``_fresh_cache``), but a cut table is a pure
    function of the model and its shape: the registry models' default tables worked out
    by an earlier test are put back, so the form's first open traces DenseNet121 (the
    registry's first model, several seconds of CPU) once a session rather than once a
    test. The form still asks the coordinator, which answers from its cache as it does a
    second visitor; the first test of a session traces for real."""
    from django.core.cache import cache

    cache.set_many(_kept_cut_tables)
    yield
    _kept_cut_tables.update(cache.get_many(_default_cut_table_keys()))


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() and not shutil.which(CHROMIUM):
        pytest.skip(
            f"no Chromium at {CHROMIUM} (install Debian's chromium or set MEDSPLIT_CHROMIUM)"
        )
    if not VENDOR.exists():
        pytest.skip("the dashboard's scripts are not built: cd frontend && npm ci && npm run build")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser, live_server, transactional_db) -> Iterator[Callable[..., object]]:
    """A fresh browser context per person, at a laptop's width (or on another coordinator
    than the live server: ``base_url``). Every request the pages make is recorded: nothing
    may go anywhere but the coordinator (no CDN).

    It asks for ``transactional_db`` so that its pages close before the test's database is
    flushed, and waits for their requests to be answered first."""
    contexts = []
    requested: list[str] = []
    bases = [live_server.url]

    def make(base_url: str | None = None) -> object:
        if base_url:
            bases.append(base_url)
        context = browser.new_context(
            base_url=base_url or live_server.url, viewport={"width": 1280, "height": 860}
        )
        context.set_default_timeout(15_000)
        context.on("request", lambda request: requested.append(request.url))
        contexts.append(context)
        return context.new_page()

    yield make
    # Let every request the pages sent be answered, stop their polling, then close them:
    # a request the live server is still serving when the database is flushed holds a
    # lock that PostgreSQL's TRUNCATE waits for while the request waits for it (deadlock).
    for context in contexts:
        for page in context.pages:
            try:
                page.wait_for_load_state("networkidle", timeout=10_000)
                page.goto("about:blank")
            except Exception:
                pass
        context.close()
    time.sleep(0.3)  # a poll sent just before about:blank is answered in milliseconds
    elsewhere = [url for url in requested if not url.startswith((*bases, "data:"))]
    assert not elsewhere, f"the dashboard fetched from outside the coordinator: {elsewhere[:5]}"
    assert any("/static/dashboard/vendor/chart.umd.min.js" in url for url in requested) or not (
        requested
    )


def sign_in(page, username: str, password: str = PASSWORD) -> None:
    page.goto("/#/sign-in")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#nav a")


@pytest.fixture(scope="session", autouse=True)
def _screenshots_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    chosen = os.environ.get(SCREENSHOTS_ENV)
    _screenshots["dir"] = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")


def screenshot(page, name: str) -> Path:
    """Save the whole page as ``name.png`` (see :data:`SCREENSHOTS_ENV`)."""
    folder = _screenshots["dir"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def assert_audit_row_reads_as_words(row, *phrases: str) -> None:
    """An audit row's summary says ``phrases`` in words, with no JSON in it, and its
    JSON shows only on demand (the "JSON" toggle)."""
    from playwright.sync_api import expect

    summary = row.get_by_test_id("audit-summary")
    for phrase in phrases:
        expect(summary).to_contain_text(phrase)
    assert '{"' not in summary.inner_text()
    shown = row.get_by_test_id("audit-json")
    expect(shown).to_be_hidden()
    row.get_by_text("JSON", exact=True).click()
    expect(shown).to_be_visible()
    assert '"crossed": {' in shown.inner_text()


class CoordinatorProcess:
    """The coordinator as its own process (``manage.py runserver``) on the test's database,
    so that a test can stop it under an open page and start it again on the same port."""

    def __init__(self, processes) -> None:
        from tests.workers.processes import free_port

        self.processes = processes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runs = 0

    def start(self) -> None:
        import sys
        import time
        import urllib.error
        import urllib.request

        self.runs += 1
        self.processes.start(
            f"coordinator-{self.runs}",
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/static/dashboard/favicon.svg", timeout=2)
                return
            except (urllib.error.URLError, OSError) as e:
                if time.monotonic() > deadline:
                    logs = self.processes.logs()
                    raise AssertionError(f"the coordinator did not start:\n{logs}") from e
                time.sleep(0.2)

    def stop(self) -> None:
        self.processes.stop(f"coordinator-{self.runs}")


@pytest.fixture
def coordinator_process(processes) -> Iterator[CoordinatorProcess]:
    """A started :class:`CoordinatorProcess`; stopped at the end (``processes`` does)."""
    coordinator = CoordinatorProcess(processes)
    coordinator.start()
    yield coordinator
