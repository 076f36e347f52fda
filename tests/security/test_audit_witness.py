"""Attack: whoever runs the coordinator, MAC key included, rewrites the audit log's history.

With the MAC key, rewritten rows get valid MACs and ``audit_verify`` cannot tell; a tail
deleted with the head rewound leaves only valid rows. The hospitals can: each agent keeps
the heads its heartbeat answers showed and checks now and then that they are still in the
chain (``hospital_agent/witness.py``). Real components: the coordinator on a live server,
a real agent's enrolment, heartbeats, chain reads and signed report over HTTP, and
``medsplit-agent status`` as a hospital's officer runs it.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command

from audit.chain import content_hash, format_timestamp
from audit.macs import mac_keys
from audit.models import AuditEvent, WitnessReport
from audit.services import audit_record
from hospital_agent.cli import main as agent_main
from hospital_agent.coordinator import Backoff, Coordinator
from hospital_agent.enrolment import enrol
from hospital_agent.identity import load_or_create_identity
from hospital_agent.service import ChainWitness
from hospital_agent.witness import CHECK_EVERY, Witness
from hospitals import services as hospital_services
from kernel.actors import Actor
from tests.platform_apps.audit.support import EVENTS, HEAD, tamper
from tests.security.test_handoff_keys import agent_config

pytestmark = pytest.mark.django_db(transaction=True)
SUMMARY = {
    "image_shape": [1, 28, 28],
    "label_counts": {"0": 20, "1": 20},
    "split_sizes": {"train": 32, "val": 8},
}


@pytest.fixture
def witness(live_server, tmp_path: Path, admin_actor: Actor):
    """A real agent, enrolled over HTTP, witnessing through its heartbeats."""
    tag = uuid.uuid4().hex[:6]
    registration = hospital_services.hospital_register(
        actor=admin_actor, name=f"Witness {tag}", slug=f"w{tag}"
    )
    config = agent_config(live_server.url, tmp_path, registration.enrolment_code.plaintext)
    identity = load_or_create_identity(tmp_path)
    credentials = enrol(config, identity)
    coordinator = Coordinator(
        live_server.url, token=credentials.token, backoff=Backoff(give_up_after=5)
    )
    chain = ChainWitness(Witness(tmp_path), coordinator, identity, credentials.hospital)

    def heartbeats(n: int):
        found = None
        for _ in range(n):
            answer = coordinator.heartbeat(status="idle", version="test", summary=SUMMARY)
            found = chain.saw(answer["audit_head"]) or found
        return found

    return chain, heartbeats, config


def _verifies() -> bool:
    out = io.StringIO()
    try:
        call_command("audit_verify", "--json", stdout=out)
    except Exception:
        return False
    return json.loads(out.getvalue())["ok"]


def _status(config, capsys) -> str:
    env_args = [
        "status",
        "--coordinator-url",
        config.coordinator_url,
        "--work-dir",
        str(config.work_dir),
        "--data-kind",
        "synthetic",
        "--data-samples",
        "40",
    ]
    assert agent_main(env_args) == 0
    return capsys.readouterr().out


def _events(n: int) -> None:
    for i in range(n):
        audit_record(actor=Actor.system(), action="test.step", details={"n": i})


def test_a_cut_tail_with_a_rewound_head_is_caught_by_the_hospitals(witness, capsys) -> None:
    _, heartbeats, config = witness
    _events(5)
    assert heartbeats(CHECK_EVERY) is None, "an honest chain passes the check"
    _events(5)
    heartbeats(1)  # the hospital is shown the new head
    last = AuditEvent.objects.order_by("-id").first()
    # The attacker, who owns the database: delete the last 4 rows, rewind the head.
    keep = AuditEvent.objects.get(id=last.id - 4)
    tamper(f"DELETE FROM {EVENTS} WHERE id > %s", [keep.id])
    tamper(f"UPDATE {HEAD} SET last_id = %s, last_hash = %s", [keep.id, keep.hash])
    assert _verifies(), "the chain alone cannot tell: every remaining row is valid"

    found = heartbeats(CHECK_EVERY)
    assert found is not None and found.found == "missing"
    assert "the chain's tail was cut" in found.message
    report = WitnessReport.objects.get()
    assert report.verified, "signed with the hospital's pinned identity key"
    assert report.witnessed_seq == last.id
    assert "CHANGED behind this hospital" in _status(config, capsys)


def test_history_rewritten_with_the_mac_key_is_caught_by_the_hospitals(witness, capsys) -> None:
    _, heartbeats, config = witness
    _events(8)
    heartbeats(1)
    # The attacker holds the MAC key too: rows from 3 on rewritten with valid MACs.
    keys = mac_keys()
    events = list(AuditEvent.objects.order_by("id"))
    previous = events[1].hash
    for event in events[2:]:
        content = {**event.content(), "prev_hash": previous, "action": "forged.history"}
        content["created_at"] = format_timestamp(event.created_at)
        new_hash = content_hash(content)
        tamper(
            f"UPDATE {EVENTS} SET action = %s, prev_hash = %s, hash = %s, mac = %s WHERE id = %s",
            ["forged.history", previous, new_hash, keys.mac(new_hash), event.id],
        )
        previous = new_hash
    tamper(f"UPDATE {HEAD} SET last_hash = %s", [previous])
    assert _verifies(), "with the key, the rewrite verifies"

    found = heartbeats(CHECK_EVERY)
    assert found is not None and "the history was rewritten" in found.message
    assert WitnessReport.objects.filter(verified=True).count() == 1
    assert AuditEvent.objects.filter(action="audit.witness_mismatch").exists()
    assert "CHANGED behind this hospital" in _status(config, capsys)


def test_a_report_not_signed_by_the_hospital_is_kept_as_unverified(witness) -> None:
    chain, _, _ = witness
    statement = json.dumps(
        {
            "hospital": chain.me,
            "witnessed": {"seq": 1, "hash": "a" * 64},
            "found": "missing",
            "message": "forged",
            "at": "now",
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    chain.coordinator.report_witness(statement=statement, signature="AAAA")
    assert not WitnessReport.objects.get().verified
