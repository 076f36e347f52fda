"""Helpers shared by the accounts and hospitals tests."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from hospitals import services
from hospitals.models import Hospital
from kernel.actors import Actor
from medsplit.protocol.keys import generate_identity_key, identity_public_b64

PROVISIONERS = "tests.platform_apps.hospitals.provisioners"


def new_identity_key() -> str:
    """A fresh agent's ML-DSA-65 identity public key, base64."""
    return identity_public_b64(generate_identity_key())


def issue_code(hospital: Hospital) -> str:
    """A fresh enrolment code for ``hospital``, issued by the system."""
    return services.enrolment_code_issue(actor=Actor.system(), hospital=hospital).plaintext


def use_provisioner(name: str) -> override_settings:
    """Settings that select provisioner class ``name`` from provisioners.py."""
    return override_settings(
        MEDSPLIT={**settings.MEDSPLIT, "REDIS_ACL_PROVISIONER": f"{PROVISIONERS}.{name}"}
    )


def throttle_rates(rate: str) -> override_settings:
    """Settings where every throttle scope allows ``rate`` (e.g. ``"2/minute"``)."""
    scopes = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    return override_settings(
        REST_FRAMEWORK={
            **settings.REST_FRAMEWORK,
            "DEFAULT_THROTTLE_RATES": dict.fromkeys(scopes, rate),
        }
    )


def assert_error(response, status: int, code: str | None = None) -> dict:
    """``response`` is an error of ``status`` with the platform's error shape."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "details"}, body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["details"], dict)
    if code is not None:
        assert body["code"] == code, body
    return body


def assert_not_authenticated(response) -> None:
    """No (valid) credentials: 401, or 403 where session authentication comes first in
    the settings (DRF then has no WWW-Authenticate to send); the code says which."""
    assert response.status_code in (401, 403), response.content
    assert_error(response, response.status_code)
    assert response.json()["code"] in ("not_authenticated", "authentication_failed")
