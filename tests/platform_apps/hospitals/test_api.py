"""The hospitals API: every endpoint's success, each role's refusal, bad input, and the
error shape of each answer."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from hospitals.models import AgentToken, EnrolmentCode, Hospital, RedisCredential
from hospitals.relay_acl import relay_username
from kernel.actors import Role
from tests.platform_apps.conftest import make_person
from tests.platform_apps.hospitals.helpers import (
    assert_error,
    assert_not_authenticated,
    issue_code,
    new_identity_key,
    throttle_rates,
    use_provisioner,
)

pytestmark = pytest.mark.django_db

SUMMARY = {
    "image_shape": [1, 28, 28],
    "label_counts": {"0": 120, "1": 300},
    "split_sizes": {"train": 380, "val": 40},
}


def heartbeat(**changes: object) -> dict:
    return {"agent_status": "idle", "agent_version": "0.1.0", "dataset_summary": SUMMARY, **changes}


def enrol(code: str, identity_key: str | None = None) -> object:
    return APIClient().post(
        "/api/agent/enrol/", {"code": code, "identity_key": identity_key or new_identity_key()}
    )


def audit_actions(slug: str) -> list[str]:
    return list(AuditEvent.objects.filter(hospital=slug).values_list("action", flat=True))


# -- list and detail ---------------------------------------------------------------------


def test_admins_and_observers_list_every_hospital(client_as, hospital_a, hospital_b) -> None:
    for who in ("consortium_admin", "observer"):
        response = client_as(who).get("/api/hospitals/")
        assert response.status_code == 200
        body = response.json()
        assert body["count"] == 2
        assert {h["slug"] for h in body["results"]} == {"st-marys", "city-general"}


def test_a_hospital_admin_lists_only_their_hospital(client_as, hospital_a, hospital_b) -> None:
    response = client_as("hospital_admin").get("/api/hospitals/")
    assert response.status_code == 200
    assert [h["slug"] for h in response.json()["results"]] == ["st-marys"]


@pytest.mark.parametrize("who", ["no_role_person", "agent_a"])
def test_no_role_and_agents_may_not_list_hospitals(client_as, hospital_a, who) -> None:
    assert_error(client_as(who).get("/api/hospitals/"), 403, "permission_denied")


def test_an_anonymous_caller_may_not_list_hospitals(client_as, hospital_a) -> None:
    assert_not_authenticated(client_as("anonymous").get("/api/hospitals/"))


def test_the_list_is_paginated(client_as, hospital_a, hospital_b) -> None:
    body = client_as("consortium_admin").get("/api/hospitals/?page_size=1").json()
    assert body["count"] == 2 and len(body["results"]) == 1 and body["next"]


def test_the_list_filters_by_status_and_online(
    client_as, hospital_a, hospital_b, requested_hospital
) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(last_seen_at=timezone.now())
    client = client_as("consortium_admin")

    def slugs(query: str) -> set[str]:
        response = client.get(f"/api/hospitals/?{query}")
        assert response.status_code == 200, response.content
        return {h["slug"] for h in response.json()["results"]}

    assert slugs("status=requested") == {"north-clinic"}
    assert slugs("online=true") == {"st-marys"}
    # Never seen (last_seen_at is NULL) counts as offline.
    assert slugs("online=false") == {"city-general", "north-clinic"}
    assert slugs("status=enrolled&online=false") == {"city-general"}


def test_a_nonsense_filter_is_400(client_as, hospital_a) -> None:
    body = assert_error(
        client_as("consortium_admin").get("/api/hospitals/?status=happy"), 400, "invalid"
    )
    assert "status" in body["details"]


def test_online_follows_the_last_heartbeat(client_as, hospital_a) -> None:
    """Time travel: a heartbeat just inside the window is online, just outside offline."""
    window = settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"]
    client = client_as("consortium_admin")
    for age, online in ((window - 5, True), (window + 5, False)):
        seen = timezone.now() - timedelta(seconds=age)
        Hospital.objects.filter(pk=hospital_a.pk).update(last_seen_at=seen)
        body = client.get("/api/hospitals/st-marys/").json()
        assert body["online"] is online
        listed = client.get(f"/api/hospitals/?online={str(online).lower()}").json()["results"]
        assert [h["slug"] for h in listed] == ["st-marys"]


def test_detail_shows_heartbeat_version_and_summary(client_as, hospital_a) -> None:
    now = timezone.now()
    Hospital.objects.filter(pk=hospital_a.pk).update(
        last_seen_at=now, agent_version="1.2.0", agent_status="busy", dataset_summary=SUMMARY
    )
    body = client_as("hospital_admin").get("/api/hospitals/st-marys/").json()
    assert body["online"] is True
    assert body["agent_version"] == "1.2.0"
    assert body["agent_status"] == "busy"
    assert body["dataset_summary"] == SUMMARY
    assert body["last_seen_at"] is not None
    assert body["status"] == "enrolled"


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("consortium_admin", "city-general", 200),
        ("observer", "city-general", 200),
        ("hospital_admin", "st-marys", 200),
        ("hospital_admin", "city-general", 404),  # another hospital's: not found
        ("no_role_person", "city-general", 403),
        ("agent_a", "city-general", 404),
        ("agent_a", "st-marys", 403),  # its own, but not through the people's API
        ("consortium_admin", "no-such-place", 404),
    ],
)
def test_detail_permissions(client_as, hospital_a, hospital_b, who, slug, status) -> None:
    response = client_as(who).get(f"/api/hospitals/{slug}/")
    if status == 200:
        assert response.status_code == 200
        assert response.json()["slug"] == slug
    else:
        assert_error(response, status)


# -- registering, joining, approving, rejecting -------------------------------------------


def test_an_admin_registers_an_approved_hospital_with_a_code(client_as) -> None:
    response = client_as("consortium_admin").post(
        "/api/hospitals/", {"name": "Riverside Hospital", "contact_email": "it@riverside.example"}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["hospital"]["slug"] == "riverside-hospital"
    assert body["hospital"]["status"] == "approved"
    code = body["enrolment_code"]["code"]
    assert code.startswith("msc_")
    stored = EnrolmentCode.objects.get(hospital__slug="riverside-hospital")
    assert code.split("_", 2)[2] not in (stored.digest, stored.key_id)  # only a hash is kept
    assert audit_actions("riverside-hospital") == ["hospital.registered", "enrolment_code.issued"]


def test_an_admin_may_register_a_hospital_as_requested(client_as) -> None:
    response = client_as("consortium_admin").post(
        "/api/hospitals/", {"name": "Hillside", "slug": "hill", "approve": False}
    )
    assert response.status_code == 201
    assert response.json()["hospital"]["status"] == "requested"
    assert response.json()["enrolment_code"] is None
    assert not EnrolmentCode.objects.exists()


@pytest.mark.parametrize("who", ["hospital_admin", "observer", "no_role_person", "agent_a"])
def test_only_consortium_admins_register_hospitals(client_as, who) -> None:
    response = client_as(who).post("/api/hospitals/", {"name": "Sneaky"})
    assert_error(response, 403, "permission_denied")
    assert not Hospital.objects.filter(name="Sneaky").exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"name": "St Marys"}, "name"),  # taken (case-insensitively)
        ({"name": "Other", "slug": "st-marys"}, "slug"),  # taken
        ({"name": "Other", "slug": "Bad_Slug"}, "slug"),
        ({"name": "Other", "slug": "join-requests"}, "slug"),  # reserved
        ({"name": "Other", "colour": "red"}, "colour"),  # unknown field
        ({"name": 12}, "name"),  # wrong type
        ({"name": "Other", "approve": "yes"}, "approve"),  # wrong type
        ({"name": "Other", "contact_email": "nope"}, "contact_email"),
        ({}, "name"),
    ],
)
def test_registration_refuses_bad_input(client_as, hospital_a, payload, field) -> None:
    before = Hospital.objects.count()
    body = assert_error(client_as("consortium_admin").post("/api/hospitals/", payload), 400)
    assert field in body["details"], body
    assert Hospital.objects.count() == before


def test_a_hospital_requests_to_join_without_an_account(db) -> None:
    response = APIClient().post(
        "/api/hospitals/join-requests/",
        {"name": "Valley Hospital", "contact_email": "it@valley.example"},
        REMOTE_ADDR="10.0.0.7",
    )
    assert response.status_code == 202, response.content
    assert response.json() == {"slug": "valley-hospital", "status": "requested"}
    event = AuditEvent.objects.get(action="hospital.join_requested")
    assert event.hospital == "valley-hospital" and event.source_ip == "10.0.0.7"


@pytest.mark.parametrize(
    "payload",
    [
        {"name": "Valley"},  # the contact address is required
        {"name": "Valley", "contact_email": "it@valley.example", "status": "enrolled"},
        {"name": ["Valley"], "contact_email": "it@valley.example"},
    ],
)
def test_a_join_request_refuses_bad_input(db, payload) -> None:
    assert_error(APIClient().post("/api/hospitals/join-requests/", payload), 400, "invalid")
    assert not Hospital.objects.exists()


def test_join_requests_are_throttled(db) -> None:
    with throttle_rates("2/minute"):
        for i in range(2):
            response = APIClient().post(
                "/api/hospitals/join-requests/",
                {"name": f"Valley {i}", "contact_email": "it@valley.example"},
            )
            assert response.status_code == 202
        response = APIClient().post(
            "/api/hospitals/join-requests/", {"name": "Valley 9", "contact_email": "a@b.example"}
        )
    assert_error(response, 429, "throttled")
    assert "Retry-After" in response
    assert not Hospital.objects.filter(name="Valley 9").exists()


def test_an_admin_approves_a_request_and_gets_a_code(client_as, requested_hospital) -> None:
    response = client_as("consortium_admin").post("/api/hospitals/north-clinic/approve/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["hospital"]["status"] == "approved"
    assert body["enrolment_code"]["code"].startswith("msc_")
    assert audit_actions("north-clinic") == ["hospital.approved", "enrolment_code.issued"]
    # The code works once.
    assert enrol(body["enrolment_code"]["code"]).status_code == 201


def test_approving_twice_is_a_conflict(client_as, approved_hospital) -> None:
    response = client_as("consortium_admin").post("/api/hospitals/lakeside/approve/")
    assert_error(response, 409, "conflict")


def test_an_admin_rejects_a_request(client_as, approved_hospital) -> None:
    code = issue_code(approved_hospital)
    response = client_as("consortium_admin").post(
        "/api/hospitals/lakeside/reject/", {"reason": "not a member"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "rejected"
    event = AuditEvent.objects.get(action="hospital.rejected")
    assert event.hospital == "lakeside" and event.details["reason"] == "not a member"
    # Its outstanding code died with it.
    assert_error(enrol(code), 410, "enrolment_code_revoked")


def test_an_enrolled_hospital_cannot_be_rejected(client_as, hospital_a) -> None:
    assert_error(client_as("consortium_admin").post("/api/hospitals/st-marys/reject/"), 409)


def test_reject_refuses_unknown_fields(client_as, requested_hospital) -> None:
    response = client_as("consortium_admin").post(
        "/api/hospitals/north-clinic/reject/", {"why": "x"}
    )
    assert "why" in assert_error(response, 400, "invalid")["details"]
    assert Hospital.objects.get(slug="north-clinic").status == "requested"


@pytest.mark.parametrize("action", ["approve", "reject"])
@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("hospital_admin", "st-marys", 403),  # their own: may not approve themselves
        ("hospital_admin", "north-clinic", 404),
        ("observer", "north-clinic", 403),
        ("no_role_person", "north-clinic", 403),
        ("agent_a", "north-clinic", 404),
        ("agent_a", "st-marys", 403),
    ],
)
def test_only_consortium_admins_approve_or_reject(
    client_as, hospital_a, requested_hospital, action, who, slug, status
) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(status=Hospital.Status.REQUESTED)
    assert_error(client_as(who).post(f"/api/hospitals/{slug}/{action}/"), status)
    assert set(Hospital.objects.values_list("status", flat=True)) == {"requested"}
    assert not EnrolmentCode.objects.exists()


# -- enrolment codes ---------------------------------------------------------------------


@pytest.mark.parametrize("who", ["consortium_admin", "hospital_admin"])
def test_a_fresh_code_revokes_the_unused_ones(client_as, hospital_a, who) -> None:
    first = issue_code(hospital_a)
    response = client_as(who).post("/api/hospitals/st-marys/enrolment-codes/")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["code"].startswith("msc_") and body["code"] != first
    assert body["expires_at"]
    assert_error(enrol(first), 410, "enrolment_code_revoked")
    assert enrol(body["code"]).status_code == 201


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("hospital_admin", "city-general", 404),
        ("observer", "st-marys", 403),
        ("no_role_person", "st-marys", 403),
        ("agent_a", "st-marys", 403),
        ("agent_a", "city-general", 404),
    ],
)
def test_who_may_not_issue_codes(client_as, hospital_a, hospital_b, who, slug, status) -> None:
    assert_error(client_as(who).post(f"/api/hospitals/{slug}/enrolment-codes/"), status)
    assert not EnrolmentCode.objects.exists()


def test_no_code_for_a_requested_hospital(client_as, requested_hospital) -> None:
    response = client_as("consortium_admin").post("/api/hospitals/north-clinic/enrolment-codes/")
    assert_error(response, 409, "conflict")


def test_only_a_consortium_admin_lifts_a_suspension(client_as, hospital_a) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(status=Hospital.Status.SUSPENDED)
    url = "/api/hospitals/st-marys/enrolment-codes/"
    assert_error(client_as("hospital_admin").post(url), 403, "permission_denied")
    assert client_as("consortium_admin").post(url).status_code == 201


# -- enrolment ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("redis_url", "relay_url", "handed_out"),
    [
        # The coordinator's admin URL: its password and options stay on the coordinator.
        (
            "rediss://default:admin-secret-0123@relay.internal:6380/0?ssl_ca_certs=/etc/ca.pem",
            "",
            "rediss://relay.internal:6380/0",
        ),
        # The address hospitals reach the relay at, where it differs from the coordinator's.
        (
            "redis://default:admin-secret-0123@10.0.0.5:6379/0",
            "rediss://relay.example.org:6380/0",
            "rediss://relay.example.org:6380/0",
        ),
    ],
)
def test_the_relay_url_handed_to_an_agent_never_holds_the_coordinators_credentials(
    approved_hospital, recorder, settings, redis_url: str, relay_url: str, handed_out: str
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "REDIS_URL": redis_url, "RELAY_URL": relay_url}
    response = enrol(issue_code(approved_hospital), new_identity_key())
    assert response.status_code == 201, response.content
    assert response.json()["relay"]["url"] == handed_out
    assert b"admin-secret" not in response.content


def test_an_agent_enrols_once_and_gets_its_token_and_relay_user(
    approved_hospital, recorder
) -> None:
    code = issue_code(approved_hospital)
    key = new_identity_key()
    response = enrol(code, key)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["hospital"] == "lakeside" and body["status"] == "enrolled"
    token = body["token"]["token"]
    assert token.startswith("msa_") and body["token"]["key_id"] in token
    relay = body["relay"]
    assert relay == {
        "url": settings.MEDSPLIT["REDIS_URL"],
        "username": f"{settings.MEDSPLIT['RELAY_PREFIX']}-hospital-lakeside",
        "password": relay["password"],
        "key_pattern": f"{settings.MEDSPLIT['RELAY_PREFIX']}:hospital:lakeside:*",
    }
    hospital = Hospital.objects.get(slug="lakeside")
    assert hospital.status == "enrolled" and hospital.identity_key == key
    # Stored hashed only.
    credential = RedisCredential.objects.get(hospital=hospital)
    assert credential.password_sha256 == hashlib.sha256(relay["password"].encode()).hexdigest()
    assert relay["password"] not in str(list(RedisCredential.objects.values()))
    assert token.split("_", 2)[2] not in str(list(AgentToken.objects.values()))
    # The token works; the code does not, twice.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    assert_error(enrol(code), 410, "enrolment_code_used")
    assert AgentToken.objects.filter(hospital=hospital).count() == 1
    assert "agent.enrolled" in audit_actions("lakeside")
    assert "token.issued" in audit_actions("lakeside")


def test_the_identity_fingerprint_is_pinned_at_enrolment_and_shown_to_administrators(
    approved_hospital, client_as, recorder
) -> None:
    from hospitals.keys import parse_identity_key

    key = new_identity_key()
    answer = enrol(issue_code(approved_hospital), key).json()
    fingerprint = parse_identity_key(key).fingerprint
    assert answer["identity"]["fingerprint"] == fingerprint
    assert answer["identity"]["generation"] == 1
    shown = client_as("observer").get("/api/hospitals/lakeside/").json()
    assert shown["identity_fingerprint"] == fingerprint and shown["identity_generation"] == 1
    assert "identity_key" not in shown and "public_key" not in shown


def test_a_legacy_agent_moves_to_an_identity_key_with_its_token(
    hospital_a, agent_client, client_as
) -> None:
    Hospital.objects.filter(pk=hospital_a.pk).update(legacy_public_key="A" * 43 + "=")
    agent = agent_client(hospital_a)
    key = new_identity_key()
    moved = agent.post("/api/agent/identity/", {"identity_key": key}, format="json")
    assert moved.status_code == 200, moved.content
    assert moved.json()["generation"] == 1
    assert agent.post("/api/agent/identity/", {"identity_key": key}, format="json").json() == (
        moved.json()
    )
    other = agent.post("/api/agent/identity/", {"identity_key": new_identity_key()}, format="json")
    assert_error(other, 409, "conflict")
    assert_error(agent.post("/api/agent/identity/", {"identity_key": "AAAA"}), 400, "invalid")
    assert (
        client_as("consortium_admin")
        .post("/api/agent/identity/", {"identity_key": key})
        .status_code
        == 403
    )
    assert "identity.replaced" in audit_actions("st-marys")


def test_enrolment_calls_the_relay_hook_with_the_users_rights(approved_hospital, recorder) -> None:
    response = enrol(issue_code(approved_hospital))
    password = response.json()["relay"]["password"]
    assert recorder.calls == [
        (
            "provision",
            {
                "username": relay_username("lakeside"),
                "password_sha256": hashlib.sha256(password.encode()).hexdigest(),
                "slug": "lakeside",
            },
        )
    ]


def test_a_relay_that_refuses_leaves_the_code_unused(approved_hospital) -> None:
    code = issue_code(approved_hospital)
    with use_provisioner("FailingProvisioner"):
        assert_error(enrol(code), 503, "relay_provisioning_failed")
    assert not AgentToken.objects.exists()
    assert not RedisCredential.objects.exists()
    assert Hospital.objects.get(slug="lakeside").status == "approved"
    assert enrol(code).status_code == 201  # nothing was spent


def test_re_enrolment_revokes_the_old_token(client_as, hospital_a, agent_client) -> None:
    old = agent_client(hospital_a)
    assert old.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    assert enrol(issue_code(hospital_a)).status_code == 201
    assert_error(old.post("/api/agent/heartbeat/", heartbeat()), 401, "authentication_failed")


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("used", "enrolment_code_used"),
        ("expired", "enrolment_code_expired"),
        ("revoked", "enrolment_code_revoked"),
    ],
)
def test_a_spent_code_is_gone_and_changes_nothing(approved_hospital, state, code) -> None:
    plaintext = issue_code(approved_hospital)
    past = timezone.now() - timedelta(seconds=1)
    field = {"used": "used_at", "expired": "expires_at", "revoked": "revoked_at"}[state]
    EnrolmentCode.objects.update(**{field: past})
    body = assert_error(enrol(plaintext), 410, code)
    assert body["message"]
    assert not AgentToken.objects.exists()
    assert Hospital.objects.get(slug="lakeside").status == "approved"
    failure = AuditEvent.objects.get(action="agent.enrol_failed")
    assert failure.details["reason"] == code and failure.hospital == "lakeside"


def test_a_code_expires_after_the_configured_time(approved_hospital) -> None:
    with override_settings(MEDSPLIT={**settings.MEDSPLIT, "ENROLMENT_CODE_TTL_SECONDS": 60}):
        issue_code(approved_hospital)
    expires = EnrolmentCode.objects.get().expires_at
    assert timedelta(seconds=55) < expires - timezone.now() <= timedelta(seconds=60)


def test_an_unknown_code_is_404_and_a_wrong_secret_too(approved_hospital) -> None:
    plaintext = issue_code(approved_hospital)
    _, key_id, secret = plaintext.split("_", 2)
    assert_error(enrol(f"msc_{'0' * 12}_{secret}"), 404, "enrolment_code_unknown")
    assert_error(enrol(f"msc_{key_id}_{secret[:-2]}xx"), 404, "enrolment_code_unknown")
    assert not AgentToken.objects.exists()
    assert enrol(plaintext).status_code == 201


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"code": "not-a-code", "identity_key": new_identity_key()}, "code"),
        ({"code": "msa_0123456789ab_secret", "identity_key": new_identity_key()}, "code"),
        ({"code": "msc_0123456789ab_secret", "identity_key": "!!!"}, "identity_key"),
        ({"code": "msc_0123456789ab_secret", "identity_key": "AAAA"}, "identity_key"),  # 3 bytes
        # An X25519 key, as agents before identity keys sent.
        ({"code": "msc_0123456789ab_secret", "identity_key": "A" * 43 + "="}, "identity_key"),
        ({"code": "msc_0123456789ab_secret", "identity_key": "A" * 2605}, "identity_key"),
        ({"code": 5, "identity_key": new_identity_key()}, "code"),
        ({"code": "msc_0123456789ab_secret"}, "identity_key"),
        ({"code": "msc_0123456789ab_secret", "public_key": new_identity_key()}, "public_key"),
        ({"code": "msc_0123456789ab_secret", "identity_key": new_identity_key(), "x": 1}, "x"),
    ],
)
def test_malformed_enrolment_input_is_400(approved_hospital, payload, field) -> None:
    issue_code(approved_hospital)
    body = assert_error(APIClient().post("/api/agent/enrol/", payload), 400, "invalid")
    assert field in body["details"], body
    assert EnrolmentCode.objects.get().used_at is None


def test_a_malformed_key_does_not_spend_a_good_code(approved_hospital) -> None:
    code = issue_code(approved_hospital)
    assert_error(APIClient().post("/api/agent/enrol/", {"code": code, "identity_key": "AAAA"}), 400)
    assert enrol(code).status_code == 201


def test_enrolment_is_throttled(approved_hospital) -> None:
    with throttle_rates("2/minute"):
        for _ in range(2):
            assert_error(enrol("msc_0123456789ab_nope"), 404)
        response = enrol(issue_code(approved_hospital))
    assert_error(response, 429, "throttled")
    assert EnrolmentCode.objects.get().used_at is None


# -- tokens ------------------------------------------------------------------------------


def test_an_agent_rotates_its_token_and_the_old_one_dies(hospital_a, agent_client) -> None:
    old = agent_client(hospital_a)
    response = old.post("/api/agent/token/rotate/")
    assert response.status_code == 201, response.content
    new_token = response.json()["token"]
    assert new_token.startswith("msa_")
    assert_error(old.post("/api/agent/heartbeat/", heartbeat()), 401, "authentication_failed")
    assert_error(old.post("/api/agent/token/rotate/"), 401, "authentication_failed")
    new = APIClient()
    new.credentials(HTTP_AUTHORIZATION=f"Bearer {new_token}")
    assert new.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    assert AgentToken.objects.filter(hospital=hospital_a, revoked_at__isnull=True).count() == 1
    rotated = AuditEvent.objects.get(action="token.rotated")
    assert rotated.hospital == "st-marys"
    assert rotated.details["new_key_id"] == response.json()["key_id"]


def test_a_token_s_last_use_is_kept_to_the_minute(hospital_a, agent_client) -> None:
    agent = agent_client(hospital_a)
    assert agent.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    token = AgentToken.objects.get(hospital=hospital_a, revoked_at__isnull=True)
    first = token.last_used_at
    assert first is not None
    # Within the minute: no write (an agent's every poll, heartbeat and record wrote it).
    assert agent.get("/api/agent/assignments/").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == first
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(seconds=61))
    assert agent.get("/api/agent/assignments/").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at > first


@pytest.mark.parametrize(
    "who", ["consortium_admin", "hospital_admin", "observer", "no_role_person"]
)
def test_people_may_not_rotate_agent_tokens(client_as, hospital_a, who) -> None:
    assert_error(client_as(who).post("/api/agent/token/rotate/"), 403, "permission_denied")


def test_rotation_needs_a_token(db) -> None:
    response = APIClient().post("/api/agent/token/rotate/")
    assert_error(response, 401, "not_authenticated")


def test_rotation_is_throttled_per_agent(hospital_a, hospital_b, agent_client) -> None:
    with throttle_rates("1/minute"):
        a = agent_client(hospital_a)
        first = a.post("/api/agent/token/rotate/").json()["token"]
        a.credentials(HTTP_AUTHORIZATION=f"Bearer {first}")
        assert_error(a.post("/api/agent/token/rotate/"), 429, "throttled")
        # Another hospital's agent has its own budget.
        assert agent_client(hospital_b).post("/api/agent/token/rotate/").status_code == 201


@pytest.mark.parametrize("who", ["consortium_admin", "hospital_admin", "observer"])
def test_token_metadata_never_holds_secrets(client_as, hospital_a, agent_client, who) -> None:
    agent_client(hospital_a)
    response = client_as(who).get("/api/hospitals/st-marys/tokens/")
    assert response.status_code == 200, response.content
    (token,) = response.json()["results"]
    assert set(token) == {"key_id", "created_at", "last_used_at", "revoked_at", "active"}
    assert token["active"] is True


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("hospital_admin", "city-general", 404),
        ("no_role_person", "st-marys", 403),
        ("agent_a", "st-marys", 403),
        ("agent_a", "city-general", 404),
    ],
)
def test_who_may_not_list_tokens(client_as, hospital_a, hospital_b, who, slug, status) -> None:
    assert_error(client_as(who).get(f"/api/hospitals/{slug}/tokens/"), status)


@pytest.mark.parametrize("who", ["consortium_admin", "hospital_admin"])
def test_revoked_tokens_stop_working_at_once(
    client_as, hospital_a, agent_client, recorder, who
) -> None:
    agent = agent_client(hospital_a)
    assert agent.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    response = client_as(who).post("/api/hospitals/st-marys/tokens/revoke/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["tokens_revoked"] == 1 and body["hospital"]["status"] == "suspended"
    assert_error(agent.post("/api/agent/heartbeat/", heartbeat()), 401, "authentication_failed")
    event = AuditEvent.objects.get(action="token.revoked")
    assert event.hospital == "st-marys"
    listed = client_as(who).get("/api/hospitals/st-marys/tokens/").json()["results"]
    assert [t["active"] for t in listed] == [False]


def test_revocation_removes_the_relay_user_through_the_hook(approved_hospital, recorder) -> None:
    assert enrol(issue_code(approved_hospital)).status_code == 201
    recorder.calls.clear()
    admin = make_person("root", Role.CONSORTIUM_ADMIN)
    client = APIClient()
    client.force_login(admin)
    assert client.post("/api/hospitals/lakeside/tokens/revoke/").json()["relay_user_revoked"]
    assert recorder.calls == [("revoke", {"username": relay_username("lakeside")})]
    assert RedisCredential.objects.get().revoked_at is not None


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("hospital_admin", "city-general", 404),
        ("observer", "st-marys", 403),
        ("no_role_person", "st-marys", 403),
        ("agent_a", "st-marys", 403),
        ("agent_a", "city-general", 404),
    ],
)
def test_who_may_not_revoke_tokens(
    client_as, hospital_a, hospital_b, agent_client, who, slug, status
) -> None:
    victim = agent_client(hospital_b if slug == "city-general" else hospital_a)
    assert_error(client_as(who).post(f"/api/hospitals/{slug}/tokens/revoke/"), status)
    assert victim.post("/api/agent/heartbeat/", heartbeat()).status_code == 200


# -- heartbeat ---------------------------------------------------------------------------


def test_a_heartbeat_records_status_version_and_summary(hospital_a, agent_client) -> None:
    response = agent_client(hospital_a).post(
        "/api/agent/heartbeat/", heartbeat(agent_status="busy", agent_version="1.3.0+dev")
    )
    assert response.status_code == 200, response.content
    assert response.json()["online"] is True
    hospital = Hospital.objects.get(pk=hospital_a.pk)
    assert hospital.last_seen_at is not None
    assert (hospital.agent_status, hospital.agent_version) == ("busy", "1.3.0+dev")
    assert hospital.dataset_summary == SUMMARY
    assert AuditEvent.objects.filter(action="agent.reported", hospital="st-marys").count() == 1


def test_an_unchanged_heartbeat_is_not_audited_again(hospital_a, agent_client) -> None:
    agent = agent_client(hospital_a)
    for _ in range(3):
        assert agent.post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    assert AuditEvent.objects.filter(action="agent.reported").count() == 1


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (heartbeat(agent_status="dancing"), "agent_status"),
        (heartbeat(agent_version="1.0 beta"), "agent_version"),
        (heartbeat(agent_version=1), "agent_version"),
        (heartbeat(extra="x"), "extra"),
        (heartbeat(dataset_summary={**SUMMARY, "images": [[0, 1]]}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "image_shape": []}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "image_shape": [1, 0, 28]}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "image_shape": [1, 2, 3, 4, 5]}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "image_shape": [1, 28.0, 28]}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "image_shape": "1x28x28"}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "label_counts": {"0": -1}}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "label_counts": {"0": "12"}}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "label_counts": {"0": True}}), "dataset_summary"),
        (heartbeat(dataset_summary={**SUMMARY, "label_counts": [120, 300]}), "dataset_summary"),
        (
            heartbeat(dataset_summary={**SUMMARY, "label_counts": {"a b/c": 1}}),
            "dataset_summary",
        ),
        (
            heartbeat(
                dataset_summary={**SUMMARY, "label_counts": {str(i): 1 for i in range(1001)}}
            ),
            "dataset_summary",
        ),
        (
            heartbeat(dataset_summary={**SUMMARY, "split_sizes": {"train": 1, "holdout": 2}}),
            "dataset_summary",
        ),
        (
            heartbeat(dataset_summary={**SUMMARY, "split_sizes": {"train": 10**10}}),
            "dataset_summary",
        ),
        (heartbeat(dataset_summary="lots"), "dataset_summary"),
        ({"agent_status": "idle", "agent_version": "1"}, "dataset_summary"),
    ],
)
def test_a_bad_heartbeat_is_400_and_changes_nothing(
    hospital_a, agent_client, payload, field
) -> None:
    response = agent_client(hospital_a).post("/api/agent/heartbeat/", payload)
    assert field in assert_error(response, 400, "invalid")["details"]
    hospital = Hospital.objects.get(pk=hospital_a.pk)
    assert hospital.last_seen_at is None and hospital.dataset_summary == {}


def test_a_thousand_labels_are_accepted(hospital_a, agent_client) -> None:
    summary = {**SUMMARY, "label_counts": {str(i): i for i in range(1000)}}
    response = agent_client(hospital_a).post(
        "/api/agent/heartbeat/", heartbeat(dataset_summary=summary)
    )
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    "who", ["consortium_admin", "hospital_admin", "observer", "no_role_person"]
)
def test_people_may_not_send_heartbeats(client_as, hospital_a, who) -> None:
    assert_error(client_as(who).post("/api/agent/heartbeat/", heartbeat()), 403)
    assert Hospital.objects.get(pk=hospital_a.pk).last_seen_at is None


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer msa_0123456789ab_nope", "Bearer nonsense", "Bearer a b", "Token xyz"],
)
def test_a_heartbeat_needs_a_valid_token(db, authorization) -> None:
    client = APIClient()
    if authorization:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    response = client.post("/api/agent/heartbeat/", heartbeat())
    assert_error(response, 401)


def test_an_agent_updates_only_its_own_hospital(hospital_a, hospital_b, agent_client) -> None:
    assert agent_client(hospital_b).post("/api/agent/heartbeat/", heartbeat()).status_code == 200
    assert Hospital.objects.get(pk=hospital_a.pk).last_seen_at is None
    assert Hospital.objects.get(pk=hospital_b.pk).last_seen_at is not None
