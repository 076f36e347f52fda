"""Signing in, attacked: guessing one account's password, login CSRF, and the Django
admin's own login form. Against the deployment (nginx, gunicorn's 2 processes, the shared
Redis) where the issue says so; the admin switched on in-process, since production has
it off.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.urls import clear_url_caches
from rest_framework.test import APIClient

from audit.models import AuditEvent
from kernel.actors import Role
from tests.platform_apps.conftest import PASSWORD, make_person
from tests.security.proxy import Deployment
from tests.security.test_proxy import SIGN_IN, sign_in

WRONG = "not the password at all"


def test_wrong_sign_ins_slow_that_account_from_that_address_only(
    deployment: Deployment, consortium_admin
) -> None:
    make_person("bob", Role.OBSERVER)
    attacker = deployment.client("127.0.0.2")
    for _ in range(settings.MEDSPLIT["SIGN_IN_FREE_FAILURES"]):  # people mistype: free
        assert sign_in(deployment, attacker, "ada", WRONG).status_code == 400
    delayed = sign_in(deployment, attacker, "ada", PASSWORD)  # even the right one, now
    assert delayed.status_code == 429, delayed.text
    assert delayed.headers["Retry-After"] == "1"
    assert "the account is not locked" in delayed.json()["message"]

    # The named admin, from their own address, and another person: not held up.
    assert sign_in(deployment, deployment.client("127.0.0.3"), "ada", PASSWORD).status_code == 200
    assert sign_in(deployment, deployment.client("127.0.0.4"), "bob", PASSWORD).status_code == 200

    # Once the delay ran out, a burst buys one guess, not one per thread; the next
    # delay is twice as long.
    time.sleep(1.05)
    with ThreadPoolExecutor(2) as pool:
        burst = list(pool.map(lambda _: sign_in(deployment, attacker, "ada", WRONG), range(2)))
    assert sorted(r.status_code for r in burst) == [400, 429]
    refused = next(r for r in burst if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) in (1, 2)

    # Never a lock-out: after the delay, the right password signs in.
    time.sleep(2.05)
    assert sign_in(deployment, attacker, "ada", PASSWORD).status_code == 200

    failed = AuditEvent.objects.filter(action="auth.sign_in_failed").order_by("id")
    assert [e.details["failures"] for e in failed] == [1, 2, 3, 4, 5, 6]
    assert [e.details["next_attempt_after"] for e in failed] == [0, 0, 0, 0, 1, 2]
    assert set(failed.values_list("source_ip", flat=True)) == {"127.0.0.2"}
    delays = AuditEvent.objects.filter(action="auth.sign_in_delayed")
    assert delays.exists() and set(delays.values_list("source_ip", flat=True)) == {"127.0.0.2"}
    assert AuditEvent.objects.filter(action="auth.signed_in").count() == 3


def test_a_cross_site_form_post_cannot_sign_a_browser_in(
    deployment: Deployment, consortium_admin
) -> None:
    """Login CSRF: a page elsewhere posts a form with the attacker's credentials."""
    victim = deployment.client("127.0.0.5")
    victim.get(f"{deployment.url}/").raise_for_status()  # the victim has used the dashboard
    response = victim.post(
        f"{deployment.url}{SIGN_IN}",
        data={"username": "ada", "password": PASSWORD},  # a form: no custom header
        headers={"Origin": "https://evil.example", "Referer": "https://evil.example/x"},
        timeout=30,
    )
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "csrf_failed"
    assert "sessionid" not in response.cookies
    # No cookie at all (a browser that never opened the dashboard): refused too.
    bare = deployment.client("127.0.0.6").post(
        f"{deployment.url}{SIGN_IN}", data={"username": "ada", "password": PASSWORD}, timeout=30
    )
    assert bare.status_code == 403 and "sessionid" not in bare.cookies
    assert not AuditEvent.objects.filter(action="auth.signed_in").exists()

    # The dashboard's own way (its page's cookie, the token in X-CSRFToken) still works.
    page = deployment.client("127.0.0.5")
    assert sign_in(deployment, page, "ada", PASSWORD).status_code == 200
    assert page.get(f"{deployment.url}/api/auth/me/").json()["username"] == "ada"


def test_the_django_admin_is_off_in_production(deployment: Deployment, consortium_admin) -> None:
    client = deployment.client("127.0.0.7")
    assert client.get(f"{deployment.url}/admin/login/").status_code == 404
    posted = client.post(
        f"{deployment.url}/admin/login/", data={"username": "ada", "password": PASSWORD}
    )
    assert posted.status_code == 404 and "sessionid" not in posted.cookies
    assert not AuditEvent.objects.exists()


@pytest.fixture
def admin_on() -> Iterator[None]:
    """The URLs with MEDSPLIT_DJANGO_ADMIN=1."""
    import coordinator.urls

    with override_settings(MEDSPLIT={**settings.MEDSPLIT, "DJANGO_ADMIN": True}):
        importlib.reload(coordinator.urls)
        clear_url_caches()
        yield
    importlib.reload(coordinator.urls)
    clear_url_caches()


@pytest.mark.django_db
def test_the_admins_login_checks_no_password_and_sends_people_to_the_sign_in(
    admin_on, consortium_admin
) -> None:
    """Turned on, /admin/login/ is no second door: it takes no password (no throttle or
    audit to bypass) and sends people to the dashboard's sign-in."""
    get_user_model().objects.filter(pk=consortium_admin.pk).update(is_staff=True)
    client = APIClient()  # CSRF aside (Django's middleware refuses a post without it)
    for _ in range(3):
        posted = client.post(
            "/admin/login/", {"username": "ada", "password": PASSWORD}, format="multipart"
        )
        assert posted.status_code == 302 and posted["Location"] == "/#/sign-in"
    assert "sessionid" not in client.cookies
    assert client.get("/admin/").status_code == 302
    assert not AuditEvent.objects.filter(action="auth.signed_in").exists()

    signed = client.post(SIGN_IN, {"username": "ada", "password": PASSWORD})
    assert signed.status_code == 200
    assert client.get("/admin/").status_code == 200  # the admin takes the session
    assert client.get("/admin/login/")["Location"] == "/admin/"

    observer = APIClient()
    observer.force_login(make_person("olga", Role.OBSERVER))
    assert observer.get("/admin/login/").status_code == 403  # not staff
