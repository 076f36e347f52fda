"""audit_record: what it writes, what it refuses, and that rows cannot be changed."""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import UTC

import pytest
from django.db import IntegrityError, transaction

from audit.chain import GENESIS, content_hash
from audit.errors import AppendOnlyError, AuditError, ChainHeadMissing
from audit.models import AuditChainHead, AuditEvent
from audit.selectors import audit_verify_chain
from audit.services import audit_record
from kernel.actors import Actor, ActorKind
from tests.platform_apps.audit.support import HEAD, tamper
from tests.platform_apps.conftest import agent_actor

pytestmark = pytest.mark.django_db


def test_the_first_event_links_to_genesis_and_hashes_its_canonical_content(
    admin_actor: Actor,
) -> None:
    event = audit_record(
        actor=admin_actor,
        action="hospital.approved",
        target="hospital:st-marys",
        hospital="st-marys",
        details={"b": 2, "a": [1, "x"]},
    )
    assert (event.id, event.prev_hash) == (1, GENESIS)
    canonical = {
        "v": 1,
        "id": 1,
        "prev_hash": GENESIS,
        "created_at": event.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "actor_kind": "person",
        "actor": "person:ada",
        "action": "hospital.approved",
        "target": "hospital:st-marys",
        "hospital": "st-marys",
        "job_id": None,
        "details": {"a": [1, "x"], "b": 2},
        "source_ip": "127.0.0.1",
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert event.hash == hashlib.sha256(text.encode()).hexdigest()
    stored = AuditEvent.objects.get(id=1)
    assert stored.hash == event.hash
    assert content_hash(stored.content()) == event.hash


def test_each_event_gets_the_next_id_and_links_to_the_previous_hash(record_many) -> None:
    events = record_many(5)
    assert [e.id for e in events] == [1, 2, 3, 4, 5]
    for previous, event in itertools.pairwise(events):
        assert event.prev_hash == previous.hash
    head = AuditChainHead.objects.get()
    assert (head.last_id, head.last_hash) == (5, events[-1].hash)
    assert [e.created_at for e in events] == sorted(e.created_at for e in events)


def test_the_actor_is_recorded_by_kind_label_and_address(admin_actor: Actor, hospital_a) -> None:
    by_person = audit_record(actor=admin_actor, action="a.person")
    by_agent = audit_record(actor=agent_actor(hospital_a), action="a.agent")
    by_system = audit_record(actor=Actor.system(), action="a.system")
    assert (by_person.actor_kind, by_person.actor, by_person.source_ip) == (
        "person",
        "person:ada",
        "127.0.0.1",
    )
    assert (by_agent.actor_kind, by_agent.actor) == ("hospital", "hospital:st-marys")
    assert (by_system.actor_kind, by_system.actor, by_system.source_ip) == (
        "system",
        "system",
        None,
    )


def test_the_event_is_kept_only_if_the_callers_transaction_commits(system_actor: Actor) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        audit_record(actor=system_actor, action="job.started", job_id=3)
        raise Abort
    assert not AuditEvent.objects.exists()
    assert audit_record(actor=system_actor, action="job.started").id == 1


def test_details_come_back_as_recorded_and_still_verify(system_actor: Actor) -> None:
    """Values a database might write differently (jsonb drops 1.0 vs 1, -0.0, exponents)."""
    details = {
        "floats": [1.0, -0.0, 1e20, 0.1, 1.5e-10, 5e-324, 1.7976931348623157e308],
        "big": 2**70,
        "text": 'Zürich ✓ \u2028 "quoted" \\ tab\t',
        "nested": {"z": None, "a": [True, False, {}], "": ""},
    }
    event = audit_record(actor=system_actor, action="details.tricky", details=details)
    stored = AuditEvent.objects.get(id=event.id)
    assert stored.details == event.details
    assert stored.details["floats"][:3] == [1, 0, 10**20]
    assert audit_verify_chain().ok


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("::FFFF:1.2.3.4", "::ffff:1.2.3.4"),
        ("2001:0DB8:0:0:1:0:0:0001", "2001:db8::1:0:0:1"),
        ("192.168.0.1", "192.168.0.1"),
    ],
)
def test_addresses_are_stored_in_the_form_the_database_gives_back(given: str, stored: str) -> None:
    event = audit_record(actor=Actor(ActorKind.SYSTEM, source_ip=given), action="ip.check")
    assert AuditEvent.objects.get(id=event.id).source_ip == stored
    assert audit_verify_chain().ok


def test_audit_error_is_a_value_error() -> None:
    assert issubclass(AuditError, ValueError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"details": {"when": object()}}, "only JSON values"),
        ({"details": {"pad": "x" * 20_000}}, "more than the 16384 allowed"),
        ({"action": ""}, "needs an action"),
        ({"action": "a" * 65}, "action is longer than 64"),
        ({"target": "t" * 201}, "target is longer than 200"),
        ({"hospital": "h" * 65}, "hospital is longer than 64"),
        ({"target": "a\x00b"}, "NUL"),
        ({"action": 12}, "must be a string"),
        ({"job_id": True}, "job_id"),
        ({"job_id": -1}, "job_id"),
        ({"job_id": "7"}, "job_id"),
        ({"job_id": 2**63}, "job_id"),
    ],
)
def test_what_cannot_be_recorded_is_refused_and_nothing_is_written(
    system_actor: Actor, fields: dict, message: str
) -> None:
    arguments = {"actor": system_actor, "action": "x.y", **fields}
    with pytest.raises(AuditError, match=message):
        audit_record(**arguments)
    assert not AuditEvent.objects.exists()
    assert not AuditChainHead.objects.filter(last_id__gt=0).exists()


@pytest.mark.parametrize("address", ["not-an-ip", "300.1.1.1", "fe80::1%eth0"])
def test_an_address_that_cannot_be_stored_is_refused(address: str) -> None:
    with pytest.raises(AuditError, match="source_ip"):
        audit_record(actor=Actor(ActorKind.SYSTEM, source_ip=address), action="x.y")


def test_a_saved_event_cannot_be_changed_or_deleted(record_many) -> None:
    event = record_many(1)[0]
    with pytest.raises(AppendOnlyError, match="changing audit event 1"):
        event.save()  # even unchanged
    event.action = "forged"
    with pytest.raises(AppendOnlyError, match="changing audit event 1"):
        event.save()
    with pytest.raises(AppendOnlyError, match="append-only"):
        event.delete()
    assert AuditEvent.objects.get(id=1).action == "test.step"


@pytest.mark.parametrize(
    "write",
    [
        lambda: AuditEvent.objects.filter(id=1).update(action="forged"),
        lambda: AuditEvent.objects.all().delete(),
        lambda: AuditEvent._base_manager.filter(id=1).update(action="forged"),
        lambda: AuditEvent.objects.bulk_update(list(AuditEvent.objects.all()), ["action"]),
        lambda: AuditEvent.objects.bulk_create([AuditEvent(id=9, action="forged")]),
        lambda: AuditEvent.objects.create(id=9, action="forged", actor="x", actor_kind="x"),
    ],
    ids=["update", "delete", "base-manager-update", "bulk-update", "bulk-create", "create"],
)
def test_bulk_writes_and_rows_made_outside_the_service_are_refused(record_many, write) -> None:
    record_many(1)
    with pytest.raises(AppendOnlyError, match="append-only"):
        write()
    assert list(AuditEvent.objects.values_list("id", "action")) == [(1, "test.step")]


def test_two_rows_can_never_share_an_id_or_a_predecessor(record_many) -> None:
    """The database's backstop against a fork, should two appends ever read one tip."""
    first = record_many(1)[0]
    rival = AuditEvent(**{**first.content(), "action": "rival"})
    rival.hash = content_hash(rival.content())
    with pytest.raises(IntegrityError), transaction.atomic():
        rival.save()
    assert AuditEvent.objects.count() == 1


def test_appends_stop_when_the_head_row_was_removed(record_many, system_actor: Actor) -> None:
    record_many(2)
    tamper(f"DELETE FROM {HEAD}")
    with pytest.raises(ChainHeadMissing, match="audit_verify"):
        audit_record(actor=system_actor, action="x.y")
    assert AuditEvent.objects.count() == 2
