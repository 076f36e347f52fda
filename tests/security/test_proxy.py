"""The coordinator behind a real proxy, attacked as a hostile insider would: Debian's nginx
with deploy/nginx.conf in front of gunicorn's 2 processes, on the test's database
(PostgreSQL under DATABASE_URL, else SQLite) with the shared Redis cache.

Before: throttles counted in each process's own memory (10 sign-ins a minute became 20
with 2 processes), and with no trusted proxy every caller had the proxy's address: one
attacker's wrong sign-ins throttled everybody, and the audit log recorded only the proxy.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection
from django.test import RequestFactory, override_settings

from audit.models import AuditEvent
from kernel.actors import client_ip
from tests.platform_apps.conftest import PASSWORD
from tests.security.proxy import Deployment

SIGN_IN = "/api/auth/sign-in/"
SIGN_INS_PER_MINUTE = 10  # MEDSPLIT_THROTTLE_SIGN_IN of the deployment


def sign_in(
    deployment: Deployment,
    session: requests.Session,
    username: str,
    password: str,
    *,
    forged: str | None = None,
) -> requests.Response:
    """Sign in as the dashboard does (its page's CSRF cookie and token, its origin),
    with a forged X-Forwarded-For if given."""
    if "csrftoken" not in session.cookies:
        session.get(f"{deployment.url}/", timeout=30).raise_for_status()
    headers = {"X-CSRFToken": session.cookies["csrftoken"], "Origin": deployment.url}
    if forged:
        headers["X-Forwarded-For"] = forged
    return session.post(
        f"{deployment.url}{SIGN_IN}",
        json={"username": username, "password": password},
        headers=headers,
        timeout=30,
    )


def test_the_deployment_runs_on_the_tests_database(deployment: Deployment) -> None:
    """Both databases are supported; which one this run uses is part of its record."""
    assert connection.vendor in ("postgresql", "sqlite")
    print(f"behind nginx on {connection.vendor}")  # shown with -s or -rA
    assert deployment.client().get(f"{deployment.url}/api/auth/me/").status_code in (401, 403)


def test_the_throttle_is_shared_by_both_processes_and_keyed_by_the_real_address(
    deployment: Deployment, consortium_admin
) -> None:
    attacker = deployment.client("127.0.0.2")
    attacker.get(f"{deployment.url}/").raise_for_status()
    # Three times the rate, at once, each for another username (no per-account delay)
    # and each claiming another address.
    tries = [(f"guess-{uuid.uuid4().hex[:8]}", f"10.66.{i}.{i}") for i in range(30)]

    def attempt(args: tuple[str, str]) -> int:
        username, forged = args
        return sign_in(deployment, attacker, username, "wrong", forged=forged).status_code

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(attempt, tries))
    assert sorted(answers) == [400] * SIGN_INS_PER_MINUTE + [429] * 20, answers
    assert len(deployment.answering_pids(SIGN_IN)) == 2, "both processes took sign-ins"

    # Someone else, from another address, is not held up by it.
    other = deployment.client("127.0.0.3")
    assert sign_in(deployment, other, "ada", PASSWORD).status_code == 200

    failed = AuditEvent.objects.filter(action="auth.sign_in_failed")
    assert failed.count() == SIGN_INS_PER_MINUTE
    assert set(failed.values_list("source_ip", flat=True)) == {"127.0.0.2"}
    throttled = AuditEvent.objects.get(action="auth.sign_in_throttled")  # once, not 20 times
    assert throttled.source_ip == "127.0.0.2" and throttled.target == "address:127.0.0.2"
    signed_in = AuditEvent.objects.get(action="auth.signed_in")
    assert signed_in.source_ip == "127.0.0.3"


def test_a_forged_forwarded_for_changes_neither_the_throttle_nor_the_audit_log(
    deployment: Deployment, consortium_admin
) -> None:
    client = deployment.client("127.0.0.4")
    response = sign_in(deployment, client, "ada", PASSWORD, forged="203.0.113.7, 10.0.0.1")
    assert response.status_code == 200, response.text
    event = AuditEvent.objects.get(action="auth.signed_in")
    assert event.source_ip == "127.0.0.4"


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (0, "203.0.113.7", "192.0.2.1"),  # no proxy: the header is the client's own words
        (1, "203.0.113.7", "203.0.113.7"),  # what nginx wrote
        (1, "198.51.100.9, 203.0.113.7", "203.0.113.7"),  # a proxy that appends: its hop
        (2, "198.51.100.9, 203.0.113.7", "198.51.100.9"),
        (1, "not-an-address", "192.0.2.1"),  # a misconfigured proxy: the peer
        (1, "", "192.0.2.1"),
    ],
)
def test_client_ip_trusts_exactly_the_configured_proxies(proxies, forwarded, expected) -> None:
    from django.conf import settings

    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR=forwarded)
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "NUM_PROXIES": proxies}):
        assert client_ip(request) == expected


def test_check_deploy_warns_when_the_processes_share_no_cache() -> None:
    from coordinator.checks import cache_is_shared

    local = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=local):
        assert [w.id for w in cache_is_shared()] == ["coordinator.W001"]
    shared = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache"}}
    with override_settings(CACHES=shared):
        assert cache_is_shared() == []
