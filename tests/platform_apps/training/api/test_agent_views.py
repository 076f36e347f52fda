"""The agent's side of the training API: assignments with what a hand-off needs, a
long-poll, hand-off records and failed preconditions."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from hospitals.models import Hospital
from kernel.actors import Actor
from medsplit.protocol.keys import (
    RecipientKey,
    SignedRecipientKey,
    fingerprint,
    generate_identity_key,
    identity_public_b64,
)
from tests.platform_apps.training.api.test_views import error, jobs, started
from training import services
from training.api.long_poll import (
    REBUILD_SECONDS,
    SHARED_REBUILD_SECONDS,
    rebuild_seconds,
    wait_for_change,
)
from training.assignment_changes import assignments_version, wake_long_polls
from training.models import HandOff, Job, Turn
from training.states import JobState

__all__ = ["jobs"]


@pytest.fixture
def agent_a(agent_client, hospital_a) -> APIClient:
    return agent_client(hospital_a)


def with_keys(*hospitals) -> list[MLDSA65PrivateKey]:
    """Give each hospital an identity key, as its agent's enrolment does."""
    keys = []
    for hospital in hospitals:
        key = generate_identity_key()
        hospital.identity_key = identity_public_b64(key)
        hospital.identity_fingerprint = fingerprint(key)
        hospital.identity_generation = 1
        hospital.save()
        keys.append(key)
    return keys


def participant(hospital, position: int) -> dict:
    return {
        "hospital": hospital.slug,
        "position": position,
        "identity_key": hospital.identity_key,
        "identity_fingerprint": hospital.identity_fingerprint,
        "identity_generation": 1,
        "identity_enrolled_at": None,
        "recipient_key": None,
    }


def test_assignments_name_the_participants_keys_and_whose_weights_to_start_from(
    agent_a, agent_client, hospital_a, hospital_c, jobs
) -> None:
    with_keys(hospital_a, hospital_c)
    job = started(jobs["ac"])
    (assignment,) = agent_a.get("/api/agent/assignments/").json()
    assert assignment["participants"] == [participant(hospital_a, 0), participant(hospital_c, 1)]
    assert assignment["handoff_from"] is None, "the first turn starts from the job's seed"
    assert assignment["start_from"] == {"kind": "initial", "sources": [], "aggregation": None}

    turn = Turn.objects.get(job=job, status="running")
    services.turn_finish(turn=turn, metrics={})
    digest = hashlib.sha256(b"sealed for c").hexdigest()
    body = {"turn": turn.pk, "recipient": hospital_c.slug, "ciphertext_sha256": digest}
    created = agent_a.post(
        f"/api/agent/assignments/{job.pk}/handoffs/", {**body, "size_bytes": 12}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["recipient"] == hospital_c.slug
    services.turn_start_next(job=job)

    (for_c,) = agent_client(hospital_c).get("/api/agent/assignments/").json()
    assert for_c["turn"]["status"] == "running"
    assert for_c["handoff_from"] == {
        "hospital": hospital_a.slug,
        "identity_fingerprint": hospital_a.identity_fingerprint,
        "round": 0,
        "turn": turn.pk,
        "ciphertext_sha256": digest,
    }
    assert for_c["start_from"] == {
        "kind": "previous",
        "sources": [for_c["handoff_from"]],
        "aggregation": None,
    }


def test_the_long_poll_answers_at_once_when_something_changed(agent_a, jobs) -> None:
    first = agent_a.get("/api/agent/assignments/")
    etag = first["ETag"]
    held = agent_a.get("/api/agent/assignments/", {"wait": 0.6, "etag": etag})
    assert held["ETag"] == etag and held.json() == first.json()
    started(jobs["ac"])
    changed = agent_a.get("/api/agent/assignments/", {"wait": 30, "etag": etag})
    assert changed["ETag"] != etag and len(changed.json()) == 1
    for bad in ("-1", "31", "soon"):
        assert "wait" in error(
            agent_a.get("/api/agent/assignments/", {"wait": bad}), 400, "invalid"
        )


def test_a_committed_change_wakes_the_long_polls_of_the_job_s_participants_only(
    jobs, hospital_a, hospital_b, hospital_c, django_capture_on_commit_callbacks
) -> None:
    # jobs["ac"] is hospital a's and c's: b's polls are not woken by it.
    before = {h.pk: assignments_version(h.pk) for h in (hospital_a, hospital_b, hospital_c)}
    with django_capture_on_commit_callbacks(execute=False) as pending:
        job = started(jobs["ac"])
    now = {h: assignments_version(h) for h in before}
    assert now == before  # not before the commit: nothing to see yet
    assert pending
    for callback in pending:
        callback()
    now = {h: assignments_version(h) for h in before}
    assert now[hospital_a.pk] > before[hospital_a.pk] and now[hospital_c.pk] > before[hospital_c.pk]
    assert now[hospital_b.pk] == before[hospital_b.pk]
    # A running turn shows in its own hospital's answer only: saving it wakes that one.
    turn = Turn.objects.get(job=job, status=Turn.Status.RUNNING)
    sender = turn.hospital
    recipient = hospital_c if sender == hospital_a else hospital_a
    with django_capture_on_commit_callbacks(execute=True):
        turn.save()
    assert assignments_version(sender.pk) == now[sender.pk] + 1
    assert assignments_version(recipient.pk) == now[recipient.pk]
    # A running turn's progress is no part of an assignment: it wakes nobody.
    with django_capture_on_commit_callbacks(execute=True):
        services.turn_record_progress(
            turn=turn, steps=4, samples=64, bytes_up=400, bytes_down=360, loss=0.6
        )
    assert Turn.objects.get(pk=turn.pk).steps == 4
    assert assignments_version(sender.pk) == now[sender.pk] + 1

    # A hand-off shows in its recipient's answer only, and matters to it only while it
    # waits for it (its own turn running, or the job ended): not before its turn.
    def record(blob: bytes) -> None:
        services.handoff_record(
            turn=turn,
            sender=sender,
            recipient=recipient,
            ciphertext_sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=4096,
        )

    seen = {h.pk: assignments_version(h.pk) for h in (sender, recipient)}
    with django_capture_on_commit_callbacks(execute=True):
        record(b"sealed")
    assert {h: assignments_version(h) for h in seen} == seen
    # Its turn completed: the sender is woken; the recipient acts on it only once its own
    # turn starts, which wakes it (the others see it at their poll's next rebuild).
    with django_capture_on_commit_callbacks(execute=True):
        turn.status = Turn.Status.COMPLETED
        turn.save()
    woken = {h: assignments_version(h) for h in seen}
    assert woken == {sender.pk: seen[sender.pk] + 1, recipient.pk: seen[recipient.pk]}
    with django_capture_on_commit_callbacks(execute=True):
        mine = services.turn_start_next(job=job)
    assert mine.hospital == recipient
    assert assignments_version(recipient.pk) == woken[recipient.pk] + 1
    assert assignments_version(sender.pk) == woken[sender.pk]
    with django_capture_on_commit_callbacks(execute=True):
        record(b"sealed")  # the same record again: nothing new, nobody woken
        HandOff.objects.filter(turn=turn).delete()
    assert assignments_version(recipient.pk) == woken[recipient.pk] + 2  # the delete
    with django_capture_on_commit_callbacks(execute=True):
        record(b"sealed again")
    assert assignments_version(recipient.pk) == woken[recipient.pk] + 3
    assert assignments_version(sender.pk) == woken[sender.pk]


def test_a_closed_job_and_a_new_identity_wake_the_polls_that_show_them(
    jobs, hospital_a, hospital_b, hospital_c, django_capture_on_commit_callbacks
) -> None:
    # Cancelling a job fails its running turn with QuerySet.update, which sends no
    # signal: the job's own save wakes its participants.
    job = started(jobs["ac"])
    seen = {h.pk: assignments_version(h.pk) for h in (hospital_a, hospital_b, hospital_c)}
    with django_capture_on_commit_callbacks(execute=True):
        services.job_transition(job=job, to=JobState.CANCELLED, actor=Actor.system())
    now = {h: assignments_version(h) for h in seen}
    assert now[hospital_a.pk] > seen[hospital_a.pk] and now[hospital_c.pk] > seen[hospital_c.pk]
    assert now[hospital_b.pk] == seen[hospital_b.pk]
    # A new identity key of hospital a shows in the answers of everyone in its jobs (c);
    # its heartbeat's save shows in none.
    with django_capture_on_commit_callbacks(execute=True):
        hospital_a.last_seen_at = timezone.now()
        hospital_a.save(update_fields=["last_seen_at"])
    assert {h: assignments_version(h) for h in seen} == now
    with django_capture_on_commit_callbacks(execute=True):
        with_keys(hospital_a)
        hospital_a.save(update_fields=["identity_key", "identity_fingerprint"])
    later = {h: assignments_version(h) for h in seen}
    assert later[hospital_c.pk] > now[hospital_c.pk] and later[hospital_a.pk] > now[hospital_a.pk]
    assert later[hospital_b.pk] == now[hospital_b.pk]


@pytest.fixture
def shared_cache(settings) -> str:
    """The coordinator's cache on the real Redis, as in a deployment (every process's
    bumps seen by every other); its keys under a prefix of this test's."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"test-long-poll-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": prefix,
        }
    }
    yield url
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
    finally:
        client.close()


def test_waiting_polls_on_a_shared_cache_wake_on_another_process_s_bump_only_their_own(
    shared_cache,
) -> None:
    from django.core.cache import cache

    from training.assignment_changes import _version_key

    assert rebuild_seconds() == SHARED_REBUILD_SECONDS  # every change bumps: rarely rebuilt
    hospitals = [10**9 + i for i in range(4)]
    wake_long_polls(hospitals)
    seen = {h: assignments_version(h) for h in hospitals}
    answers: dict[int, tuple[int, float]] = {}
    began = time.monotonic()

    def poll(hospital: int) -> None:
        value = wait_for_change(hospital, seen[hospital], until=began + 1.5)
        answers[hospital] = (value, time.monotonic() - began)

    threads = [threading.Thread(target=poll, args=(h,)) for h in hospitals]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    # Another process (the worker) bumps hospital 2's counter: no poke reaches this one,
    # so only the watcher's read of the shared cache can wake the poll.
    other_process = redis.Redis.from_url(shared_cache)
    try:
        other_process.incr(cache.make_key(_version_key(hospitals[2])))
    finally:
        other_process.close()
    for thread in threads:
        thread.join(5)
    value, after = answers[hospitals[2]]
    assert value == seen[hospitals[2]] + 1 and after < 0.7
    for hospital in (hospitals[0], hospitals[1], hospitals[3]):
        value, after = answers[hospital]
        assert value == seen[hospital] and after >= 1.5  # waited out its deadline


def test_a_waiting_long_poll_wakes_on_a_bump_and_rebuilds_without_one() -> None:
    hospital = 10**9  # a counter of its own
    seen = assignments_version(hospital)
    began = time.monotonic()
    # No bump: back after the rebuild interval.
    assert wait_for_change(hospital, seen, until=began + 30) == seen
    assert REBUILD_SECONDS <= time.monotonic() - began < REBUILD_SECONDS + 0.3
    bump = threading.Timer(0.05, wake_long_polls, args=([hospital],))
    began = time.monotonic()
    bump.start()
    try:
        assert wait_for_change(hospital, seen, until=began + 30) != seen
    finally:
        bump.join()
    assert time.monotonic() - began < REBUILD_SECONDS / 2  # woken, not rebuilt
    wake_long_polls([hospital + 1])  # another hospital's bump does not wake it
    began = time.monotonic()
    now = assignments_version(hospital)
    assert wait_for_change(hospital, now, until=began + 0.1) == now
    assert time.monotonic() - began < 0.3  # the poll's own deadline first


def test_finished_jobs_stay_visible_so_agents_fetch_the_final_weights(agent_a, jobs) -> None:
    job = started(jobs["ac"])
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=job.started_at)
    (assignment,) = agent_a.get("/api/agent/assignments/").json()
    assert assignment["state"] == "completed"


def test_hand_offs_are_recorded_only_for_the_agents_own_turns(
    agent_a, agent_client, hospital_b, hospital_c, jobs
) -> None:
    job = started(jobs["bc"])
    turn = Turn.objects.get(job=job, status="running")
    body = {"turn": turn.pk, "recipient": hospital_c.slug, "ciphertext_sha256": "a" * 64}
    body["size_bytes"] = 1
    url = f"/api/agent/assignments/{job.pk}/handoffs/"
    error(agent_a.post(url, body, format="json"), 404, "not_found")
    agent_b = agent_client(hospital_b)
    details = error(
        agent_b.post(url, {**body, "recipient": "nowhere"}, format="json"), 400, "invalid"
    )
    assert "recipient" in details
    assert agent_b.post(url, body, format="json").status_code == 201
    assert HandOff.objects.get().sender == hospital_b


def test_an_agent_records_the_blobs_it_sealed_for_several_recipients_all_or_none(
    agent_client, make_job, hospital_a, hospital_b, hospital_c
) -> None:
    job = started(
        make_job(participants=[{"hospital": h.slug} for h in (hospital_a, hospital_b, hospital_c)])
    )
    turn = Turn.objects.get(job=job, status="running")
    sender = agent_client(turn.hospital)
    others = [h for h in (hospital_a, hospital_b, hospital_c) if h != turn.hospital]
    url = f"/api/agent/assignments/{job.pk}/handoffs/batch/"

    def sealed(*entries: tuple[Hospital, str]) -> dict:
        return {
            "turn": turn.pk,
            "handoffs": [
                {"recipient": h.slug, "ciphertext_sha256": digest * 64, "size_bytes": 4096}
                for h, digest in entries
            ],
        }

    body = sealed((others[0], "a"), (others[1], "b"))
    created = sender.post(url, body, format="json")
    assert created.status_code == 201, created.content
    assert [r["recipient"] for r in created.json()] == [h.slug for h in others]
    assert AuditEvent.objects.filter(action="handoff.recorded").count() == 2
    assert sender.post(url, body, format="json").status_code == 201  # the same again
    assert (
        HandOff.objects.count() == 2
        and AuditEvent.objects.filter(action="handoff.recorded").count() == 2
    )
    # All or none: one bad entry and nothing is recorded, each problem named.
    HandOff.objects.all().delete()
    bad = sealed((others[0], "a"), (others[1], "b"))
    bad["handoffs"].append({"recipient": "nowhere", "ciphertext_sha256": "c" * 64, "size_bytes": 1})
    assert "nowhere" in str(error(sender.post(url, bad, format="json"), 400, "invalid"))
    twice = sealed((others[0], "a"), (others[0], "b"))
    assert "named twice" in str(error(sender.post(url, twice, format="json"), 400, "invalid"))
    to_self = sealed((others[0], "a"), (turn.hospital, "b"))
    assert "itself" in str(error(sender.post(url, to_self, format="json"), 400, "invalid"))
    assert "handoffs" in error(sender.post(url, sealed(), format="json"), 400, "invalid")
    assert not HandOff.objects.exists()
    assert sender.post(url, sealed((others[0], "a")), format="json").status_code == 201
    error(
        sender.post(url, sealed((others[1], "b"), (others[0], "f")), format="json"), 409, "conflict"
    )
    assert list(HandOff.objects.values_list("recipient", flat=True)) == [others[0].pk]
    # Only the agent whose turn it was records its hand-offs.
    error(
        agent_client(others[0]).post(url, sealed((others[1], "b")), format="json"), 404, "not_found"
    )


def test_a_hand_off_named_by_an_attempt_tried_again_is_recorded_against_the_one_that_completed(
    agent_client, make_job, hospital_a, hospital_b
) -> None:
    # The server side of the hospital's turn failed and was tried again while its run
    # went on: the agent names the attempt it was assigned.
    job = make_job(participants=[{"hospital": h.slug} for h in (hospital_a, hospital_b)],
                   on_failure="retry", max_retries=2)  # fmt: skip
    job = started(job)
    assigned = Turn.objects.get(job=job, status="running")
    services.turn_fail(turn=assigned, reason="the worker died")
    again = services.turn_start_next(job=job)
    assert (again.position, again.attempt) == (assigned.position, assigned.attempt + 1)
    services.turn_finish(turn=again, metrics={})
    other = hospital_b if assigned.hospital == hospital_a else hospital_a
    body = {"turn": assigned.pk, "handoffs": [
        {"recipient": other.slug, "ciphertext_sha256": "d" * 64, "size_bytes": 64}
    ]}  # fmt: skip
    url = f"/api/agent/assignments/{job.pk}/handoffs/batch/"
    created = agent_client(assigned.hospital).post(url, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()[0]["turn"] == again.pk
    assert HandOff.objects.get().turn == again


def test_a_failed_precondition_fails_the_turn_with_the_agents_reason(
    agent_a, hospital_a, jobs
) -> None:
    job = started(jobs["ac"])
    turn = Turn.objects.get(job=job, status="running")
    url = f"/api/agent/assignments/{job.pk}/problems/"
    reason = "images/0042.png: cannot be read (truncated PNG)"
    response = agent_a.post(url, {"turn": turn.pk, "reason": reason}, format="json")
    assert response.status_code == 200, response.content
    turn.refresh_from_db()
    assert turn.status == "failed"
    assert turn.failure_reason == f"{hospital_a.slug} reported a failed precondition: {reason}"
    reported = AuditEvent.objects.get(action="turn.problem_reported")
    assert reported.actor_kind == "hospital" and reported.details == {"reason": reason}
    again = agent_a.post(url, {"turn": turn.pk, "reason": reason}, format="json")
    error(again, 409, "conflict")
    assert "reason" in error(
        agent_a.post(url, {"turn": turn.pk, "reason": " "}, format="json"), 400, "invalid"
    )


def test_an_agent_publishes_its_signed_per_job_key_and_the_others_see_it(
    agent_a, agent_client, hospital_a, hospital_c, jobs
) -> None:
    key_a, _ = with_keys(hospital_a, hospital_c)
    job = started(jobs["ac"])
    url = f"/api/agent/assignments/{job.pk}/recipient-key/"
    public = RecipientKey.generate().public()
    signed = SignedRecipientKey.sign(
        job=f"job-{job.pk}", hospital=hospital_a.slug, key=public, identity=key_a
    )
    created = agent_a.post(url, signed.to_json(), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["sha256"] == public.sha256()
    again = agent_a.post(url, signed.to_json(), format="json")
    assert again.status_code == 201
    assert AuditEvent.objects.filter(action="recipient_key.published").count() == 1
    (for_c,) = agent_client(hospital_c).get("/api/agent/assignments/").json()
    shown = for_c["participants"][0]["recipient_key"]
    assert shown["key"] == public.b64() and shown["sha256"] == public.sha256()
    assert (
        SignedRecipientKey.from_json(
            job=f"job-{job.pk}", hospital=hospital_a.slug, data=shown
        ).verify(key_a.public_key())
        == public
    )

    # Signed by another identity, or for another job: refused, nothing changes.
    forged = SignedRecipientKey.sign(
        job=f"job-{job.pk}", hospital=hospital_a.slug, key=public, identity=generate_identity_key()
    )
    assert "key" in error(agent_a.post(url, forged.to_json(), format="json"), 400, "invalid")
    elsewhere = SignedRecipientKey.sign(
        job=f"job-{job.pk + 1}", hospital=hospital_a.slug, key=public, identity=key_a
    )
    assert "key" in error(agent_a.post(url, elsewhere.to_json(), format="json"), 400, "invalid")
    unsigned = {"key": public.b64(), "signature": ""}
    error(agent_a.post(url, unsigned, format="json"), 400, "invalid")

    # A re-enrolment under a new identity hides the key its old identity signed.
    Hospital.objects.filter(pk=hospital_a.pk).update(identity_generation=2)
    (for_c,) = agent_client(hospital_c).get("/api/agent/assignments/").json()
    assert for_c["participants"][0]["recipient_key"] is None
    assert for_c["participants"][0]["identity_generation"] == 2


def test_no_recipient_key_for_a_job_not_ones_own_or_ended(
    agent_a, agent_client, hospital_a, hospital_b, hospital_c, jobs
) -> None:
    (key_b,) = with_keys(hospital_b)
    job = started(jobs["ac"])
    public = RecipientKey.generate().public()
    signed = SignedRecipientKey.sign(
        job=f"job-{job.pk}", hospital=hospital_b.slug, key=public, identity=key_b
    )
    url = f"/api/agent/assignments/{job.pk}/recipient-key/"
    error(agent_client(hospital_b).post(url, signed.to_json(), format="json"), 404, "not_found")
    # A's agent has no identity key yet (enrolled before identity keys).
    mine = SignedRecipientKey.sign(
        job=f"job-{job.pk}", hospital=hospital_a.slug, key=public, identity=key_b
    )
    error(agent_a.post(url, mine.to_json(), format="json"), 409, "conflict")
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=job.started_at)
    error(agent_a.post(url, mine.to_json(), format="json"), 409, "conflict")


def _builds(queries) -> int:
    return sum('FROM "training_job"' in q["sql"] for q in queries)


@pytest.mark.parametrize("cache", ["shared", "local"])
def test_a_poll_holding_the_answer_last_built_waits_before_building_it_again(
    cache, request, agent_a, jobs
) -> None:
    if cache == "shared":
        request.getfixturevalue("shared_cache")
    first = agent_a.get("/api/agent/assignments/", {"wait": 0.3})
    with CaptureQueriesContext(connection) as queries:
        held = agent_a.get("/api/agent/assignments/", {"wait": 0.3, "etag": first["ETag"]})
    assert held["ETag"] == first["ETag"] and held.json() == first.json()
    # Shared: nothing bumped since that answer was built, so it is built once, at the end;
    # a process-local cache cannot tell (the worker's changes bump another process's).
    assert _builds(queries) == (1 if cache == "shared" else 2)
    started(jobs["ac"])  # bumps: the next poll builds at once and answers the change
    with CaptureQueriesContext(connection) as queries:
        changed = agent_a.get("/api/agent/assignments/", {"wait": 30, "etag": held["ETag"]})
    assert changed["ETag"] != held["ETag"] and _builds(queries) == 1
