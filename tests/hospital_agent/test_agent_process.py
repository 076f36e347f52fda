"""An agent process against a live coordinator: a revoked token stops it with a clear
message; local data it cannot use fails its turn with a reason naming the file."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from django.utils import timezone
from PIL import Image

from audit.models import AuditEvent
from hospitals import services as hospital_services
from hospitals.models import Hospital
from hospitals.selectors import hospital_is_online
from kernel.actors import Actor
from kernel.errors import InvalidInput
from tests.hospital_agent.test_end_to_end import consortium
from tests.workers.processes import Processes, processes, wait_until
from training import services
from training.models import Turn
from training.scheduling import job_advance
from training.states import JobState

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def start(processes: Processes, url: str, tmp_path: Path, code: str, **data: str):
    env = {
        **processes.env,
        "MEDSPLIT_AGENT_COORDINATOR_URL": url,
        "MEDSPLIT_AGENT_WORK_DIR": str(tmp_path / "agent"),
        "MEDSPLIT_AGENT_ENROLMENT_CODE": code,
        "MEDSPLIT_AGENT_POLL_SECONDS": "1",
        "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "1",
        **{f"MEDSPLIT_AGENT_DATA_{k.upper()}": v for k, v in data.items()},
    }
    return processes.start("agent", [sys.executable, "-m", "hospital_agent", "run"], env=env)


def enrolled(hospital: Hospital) -> bool:
    hospital.refresh_from_db()
    return hospital.status == "enrolled" and bool(hospital.dataset_summary)


def test_a_revoked_token_stops_the_agent_with_a_clear_message(
    processes: Processes, consortium: str, tmp_path: Path, admin_actor: Actor
) -> None:
    registration = hospital_services.hospital_register(actor=admin_actor, name="Revoked General")
    hospital = registration.hospital
    agent = start(
        processes, consortium, tmp_path, registration.enrolment_code.plaintext,
        kind="synthetic", samples="40",
    )  # fmt: skip
    wait_until("the agent to enrol", lambda: enrolled(hospital), 60, processes)
    hospital_services.hospital_tokens_revoke(actor=admin_actor, hospital=hospital)
    wait_until("the agent to stop", lambda: agent.poll() is not None, 30, processes)
    assert agent.returncode == 3
    log = (processes.folder / "agent.log").read_text()
    assert "token was revoked or is unknown" in log and "new enrolment code" in log


def test_unusable_data_fails_the_turn_naming_the_file_and_no_pixel(
    processes: Processes, consortium: str, tmp_path: Path, admin_actor: Actor
) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    rows = ["file,label"]
    for i in range(12):
        Image.new("L", (28, 28), color=40 + i).save(folder / f"scan-{i:02d}.png")
        rows.append(f"scan-{i:02d}.png,{i % 2}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    registration = hospital_services.hospital_register(actor=admin_actor, name="Broken Files")
    hospital = registration.hospital
    start(
        processes, consortium, tmp_path, registration.enrolment_code.plaintext,
        kind="folder", path=str(folder),
    )  # fmt: skip
    wait_until("the agent to enrol", lambda: enrolled(hospital), 60, processes)
    # After enrolment (its check passed), one image is damaged and a label is out of range.
    (folder / "scan-07.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (folder / "labels.csv").write_text("\n".join([*rows[:-1], "scan-11.png,5"]) + "\n")
    job = services.job_create(
        actor=admin_actor,
        data={
            "model": "small_cnn",
            "num_classes": 2,
            "cuts": ["pool1"],
            "on_failure": "fail",
            "participants": [{"hospital": hospital.slug}],
        },
    )
    services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    turn = job_advance(job_id=job.pk)  # the scheduler's step; no worker is needed here
    assert turn is not None

    def failed() -> bool:
        turn.refresh_from_db()
        return turn.status == Turn.Status.FAILED

    wait_until("the agent to give its turn up", failed, 60, processes)
    assert f"{hospital.slug} reported a failed precondition" in turn.failure_reason
    assert "scan-07.png" in turn.failure_reason and "scan-11.png" in turn.failure_reason
    # Its heartbeats now say so, and the summary reported before no longer shows.
    wait_until(
        "the agent to report its data problem",
        lambda: Hospital.objects.get(pk=hospital.pk).agent_status == "data_problem",
        30,
        processes,
    )
    hospital.refresh_from_db()
    assert "scan-07.png" in hospital.data_problem and hospital.dataset_summary == {}
    # The images' pixel values are 40..51; the reason names files (their folder aside:
    # pytest's temporary path holds numbers of its own), never a value.
    reason = turn.failure_reason.split(":", 1)[1].replace(str(folder), "<folder>")
    assert not [v for v in range(40, 52) if str(v) in reason], f"a pixel value in: {reason}"
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def test_sigterm_stops_the_agent_cleanly_and_a_restart_reuses_its_identity(
    processes: Processes, consortium: str, tmp_path: Path, admin_actor: Actor
) -> None:
    registration = hospital_services.hospital_register(actor=admin_actor, name="Calm Clinic")
    hospital = registration.hospital
    code = registration.enrolment_code.plaintext
    agent = start(processes, consortium, tmp_path, code, kind="synthetic", samples="40")
    wait_until("the agent to enrol", lambda: enrolled(hospital), 60, processes)
    key = hospital.identity_key
    agent.send_signal(signal.SIGTERM)
    wait_until("the agent to stop", lambda: agent.poll() is not None, 30, processes)
    assert agent.returncode == 0
    assert "stopped" in (processes.folder / "agent.log").read_text()
    # Started again (the used code still in its environment): no second enrolment.
    restarted = timezone.now()
    again = start(processes, consortium, tmp_path, code, kind="synthetic", samples="40")

    def fresh_heartbeat() -> bool:
        hospital.refresh_from_db()
        return again.poll() is None and hospital.last_seen_at > restarted

    wait_until("a heartbeat from the restarted agent", fresh_heartbeat, 30, processes)
    assert hospital.identity_key == key
    assert (processes.folder / "agent.log").read_text().count("enrolled as") == 1
    # Both starts are in the audit log, the second naming the first.
    starts = AuditEvent.objects.filter(action="agent.started", hospital=hospital.slug)
    assert starts.count() == 2
    assert starts.order_by("id").last().details["previous_start"] is not None


def test_an_agent_whose_data_is_broken_keeps_heartbeating_and_says_why(
    processes: Processes, consortium: str, tmp_path: Path, admin_actor: Actor
) -> None:
    """Before: it sent no heartbeat, so it showed "offline" and a new job was refused with
    "has not reported a dataset summary yet; start its agent", though it was running."""
    archive = tmp_path / "breast.npz"
    archive.write_bytes(b"PK\x03\x04 a truncated archive")
    registration = hospital_services.hospital_register(actor=admin_actor, name="Truncated Data")
    hospital = registration.hospital
    start(
        processes, consortium, tmp_path, registration.enrolment_code.plaintext,
        kind="medmnist", path=str(archive),
    )  # fmt: skip

    def reports_the_problem() -> bool:
        hospital.refresh_from_db()
        return hospital.agent_status == "data_problem" and bool(hospital.data_problem)

    wait_until("the agent to report its data problem", reports_the_problem, 60, processes)
    assert "breast.npz" in hospital.data_problem
    assert hospital.dataset_summary == {}, "no summary on show as if it were valid"
    assert hospital_is_online(hospital=hospital)
    with pytest.raises(InvalidInput) as refused:
        services.job_create(
            actor=admin_actor,
            data={
                "model": "small_cnn",
                "num_classes": 2,
                "cuts": ["pool1"],
                "participants": [{"hospital": hospital.slug}],
            },
        )
    assert "reports a problem with its data" in str(refused.value.details)
