"""The agent's pieces on their own: configuration, identity files, snapshots on disk,
retries against an unreachable coordinator, sealed hand-offs on the real Redis."""

from __future__ import annotations

import http.server
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import ClassVar

import pytest
import redis

from hospital_agent.cli import main
from hospital_agent.coordinator import Backoff, Coordinator, CoordinatorUnreachable
from hospital_agent.identity import (
    Credentials,
    load_credentials,
    load_or_create_identity,
    save_credentials,
)
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import PeerKeyRefused, Pins
from hospital_agent.relay import HandoffMissing, Relay
from hospital_agent.snapshots import FileSnapshots
from hospital_agent.turns import Assignment
from medsplit.errors import ConfigError, SealError, UnknownModelError
from medsplit.protocol.keys import (
    RecipientKey,
    SignedRecipientKey,
    fingerprint,
    format_fingerprint,
    generate_identity_key,
    identity_public_b64,
)
from medsplit.protocol.sealing import SealContext
from tests.redis_server import session_keys


def test_check_validates_offline_and_prints_the_summary(tmp_path: Path, capsys) -> None:
    args = ["check", "--coordinator-url", "https://nowhere.invalid", "--work-dir", str(tmp_path)]
    assert main([*args, "--data-kind", "synthetic", "--data-samples", "30"]) == 0
    out = capsys.readouterr().out
    assert '"split_sizes"' in out and '"label_counts"' in out
    assert main([*args, "--data-kind", "folder", "--data-path", str(tmp_path / "none")]) == 2
    assert "none" in capsys.readouterr().err


def test_the_identity_key_and_credentials_are_kept_for_this_user_only(tmp_path: Path) -> None:
    key = load_or_create_identity(tmp_path)
    assert (tmp_path / "identity.key").stat().st_mode & 0o777 == 0o600
    assert fingerprint(load_or_create_identity(tmp_path)) == fingerprint(key), "reused"
    credentials = Credentials("h", "msa_x", "redis://relay:6379/0", "hospital-h", "pw", 1)
    save_credentials(tmp_path, credentials)
    assert (tmp_path / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert load_credentials(tmp_path) == credentials
    assert credentials.relay() == "redis://hospital-h:pw@relay:6379/0"
    # Credentials of an agent enrolled before identity keys: generation 0.
    (tmp_path / "credentials.json").write_text(
        '{"hospital": "h", "token": "t", "relay_url": "redis://r", "relay_username": "u", '
        '"relay_password": "p"}'
    )
    assert load_credentials(tmp_path).identity_generation == 0
    os.chmod(tmp_path / "identity.key", 0o644)
    with pytest.raises(ConfigError, match="may be read by other users"):
        load_or_create_identity(tmp_path)


def test_snapshots_on_disk_keep_the_start_and_the_two_newest(tmp_path: Path) -> None:
    snapshots = FileSnapshots(tmp_path / "turn")
    for step in (0, 3, 6, 9):
        snapshots.save(step, f"state {step}".encode())
    assert snapshots.steps() == [0, 6, 9]
    assert FileSnapshots(tmp_path / "turn").load(9) == b"state 9", "a restarted agent sees them"
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (tmp_path / "turn").iterdir())


def test_an_unreachable_coordinator_is_retried_with_backoff_then_reported(caplog) -> None:
    coordinator = Coordinator(
        "http://127.0.0.1:1", backoff=Backoff(first=0.05, longest=0.1, give_up_after=0.4)
    )
    with caplog.at_level(logging.WARNING), pytest.raises(CoordinatorUnreachable, match="gave up"):
        coordinator.heartbeat(status="idle", version="1", summary={})
    assert caplog.text.count("trying again") >= 2
    stopping = threading.Event()
    stopping.set()
    quick = Coordinator("http://127.0.0.1:1", stopping=stopping)
    with pytest.raises(CoordinatorUnreachable):
        quick.heartbeat(status="idle", version="1", summary={})


@pytest.fixture
def relays(redis_url: str):
    if not redis_url.startswith("redis://"):
        pytest.skip("these hand-off tests use a Redis reached over TCP")
    host = redis_url.split("://", 1)[1]
    made = []

    def relay(slug: str) -> Relay:
        made.append(slug)
        return Relay(Credentials(slug, "t", f"redis://{host}", "default", "unused"))

    yield relay
    client = redis.Redis.from_url(redis_url)
    for slug in made:
        for key in client.scan_iter(match=session_keys().outbox_pattern(slug)):
            client.delete(key)
    client.close()


def test_a_hand_off_opens_only_for_its_recipient_and_its_place(relays) -> None:
    a_identity, b_identity = generate_identity_key(), generate_identity_key()
    b_key = RecipientKey.generate()
    job = f"test-{uuid.uuid4().hex[:6]}"
    a, b = relays("a"), relays("b")
    context = SealContext(job=job, round=1, sender="a", recipient="b")
    keys = session_keys()
    published = SignedRecipientKey.sign(
        job=job, hospital="b", key=b_key.public(), identity=b_identity
    )
    digest, size = a.put_handoff(
        keys=keys, job=job, state=b"weights", identity=a_identity, recipient="b",
        recipient_key=published, recipient_identity=b_identity.public_key(), context=context,
    )  # fmt: skip
    stop = threading.Event()
    sender = a_identity.public_key()
    taken = b.take_handoff(
        keys=keys, job=job, key=b_key, sender="a", sender_identity=sender,
        context=context, expected_sha256=digest, wait=1, stopping=stop,
    )  # fmt: skip
    assert taken == b"weights" and size > len(b"weights")
    replayed = SealContext(job=job, round=2, sender="a", recipient="b")
    with pytest.raises(SealError, match="round"):
        b.take_handoff(
            keys=keys, job=job, key=b_key, sender="a", sender_identity=sender,
            context=replayed, expected_sha256=digest, wait=0, stopping=stop,
        )  # fmt: skip
    with pytest.raises(HandoffMissing, match="not the one the coordinator recorded"):
        b.take_handoff(
            keys=keys, job=job, key=b_key, sender="a", sender_identity=sender,
            context=context, expected_sha256="0" * 64, wait=0, stopping=stop,
        )  # fmt: skip
    with pytest.raises(HandoffMissing, match="not on the relay"):
        a.take_handoff(
            keys=keys, job=job, key=RecipientKey.generate(), sender="b",
            sender_identity=b_identity.public_key(),
            context=context, expected_sha256=None, wait=0, stopping=stop,
        )  # fmt: skip


def test_weights_are_sealed_first_for_the_hospital_whose_turn_comes_next() -> None:
    order = ["a", "b", "c", "d"]
    assignment = Assignment({"participants": [{"hospital": h} for h in order]})
    assert [p["hospital"] for p in assignment.others("b")] == ["c", "d", "a"]
    assert [p["hospital"] for p in assignment.others("d")] == ["a", "b", "c"]
    assert [p["hospital"] for p in assignment.others("a")] == ["b", "c", "d"]


class _Throttling(http.server.BaseHTTPRequestHandler):
    """A real HTTP server that throttles the first two requests, as DRF does (429 with
    ``Retry-After``), then answers."""

    calls: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.calls.append(time.monotonic())
        throttled = len(self.calls) <= 2
        body = (
            b'{"code": "throttled", "message": "Request was throttled."}'
            if throttled
            else b'{"hospital": "h"}'
        )
        self.send_response(429 if throttled else 201)
        if throttled:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_throttled_call_waits_as_long_as_the_coordinator_asks_then_goes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _Throttling.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Throttling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        # Backoff alone would retry after 0.05 s; Retry-After says 1 s.
        coordinator = Coordinator(url, backoff=Backoff(first=0.05, longest=0.1, give_up_after=10))
        with caplog.at_level(logging.WARNING):
            assert coordinator.enrol(code="msc_x", identity_key="k") == {"hospital": "h"}
        first, second, third = _Throttling.calls
        assert second - first >= 0.95 and third - second >= 0.95
        assert caplog.text.count("asks this agent to slow down (429)") == 2
    finally:
        server.shutdown()


def test_a_refused_server_frame_is_reported_and_a_revoked_token_still_stops_the_agent() -> None:
    from hospital_agent.coordinator import CoordinatorRefused, TokenRefused
    from hospital_agent.turns import report_refusal
    from medsplit.protocol.checks import FrameRejected

    refusal = FrameRejected("finite", "tensor 'pool1' holds NaN", kind="gradients", step=2)
    refusal = refusal.sent_by("the server")

    class Coordinator:
        def __init__(self, error: Exception | None = None) -> None:
            self.error, self.reasons = error, []

        def report_problem(self, *, job: int, turn: int, reason: str) -> dict:
            self.reasons.append((job, turn, reason))
            if self.error is not None:
                raise self.error
            return {}

    ok = Coordinator()
    report_refusal(ok, job=4, turn_id=9, refusal=refusal)  # type: ignore[arg-type]
    reason = "the server's gradients frame for step 2 failed the 'finite' check: tensor 'pool1'"
    assert ok.reasons == [(4, 9, f"{reason} holds NaN")]
    # The turn ended meanwhile: nothing more to do. A revoked token: the agent stops.
    ended = Coordinator(CoordinatorRefused(409, "conflict", "not running"))
    report_refusal(ended, job=4, turn_id=9, refusal=refusal)  # type: ignore[arg-type]
    revoked = Coordinator(TokenRefused(401, "unauthorized", "revoked"))
    with pytest.raises(TokenRefused):
        report_refusal(revoked, job=4, turn_id=9, refusal=refusal)  # type: ignore[arg-type]


def _participant(slug: str, key, generation: int = 1) -> dict:
    return {
        "hospital": slug,
        "identity_key": identity_public_b64(key),
        "identity_fingerprint": fingerprint(key),
        "identity_generation": generation,
        "identity_enrolled_at": "2026-12-01T10:00:00Z",
    }


def test_a_peer_is_pinned_at_first_sight_and_only_a_re_enrolment_changes_it(
    tmp_path: Path, caplog
) -> None:
    pins, first, second = Pins(tmp_path), generate_identity_key(), generate_identity_key()
    assert fingerprint(pins.identity(_participant("b", first))) == fingerprint(first)
    assert (tmp_path / "peers.json").stat().st_mode & 0o777 == 0o600
    assert pins.identity(_participant("b", first)) == first.public_key()
    for generation in (1, 0):  # the same generation, or one set back: no re-enrolment
        with pytest.raises(PeerKeyRefused, match="no re-enrolment to show for it"):
            pins.identity(_participant("b", second, generation))
    stated = {**_participant("b", first), "identity_fingerprint": "0" * 64}
    with pytest.raises(PeerKeyRefused, match="states the fingerprint"):
        pins.identity(stated)
    with pytest.raises(PeerKeyRefused, match="has no identity key yet"):
        pins.identity({"hospital": "c", "identity_key": ""})
    with caplog.at_level(logging.WARNING):
        assert pins.identity(_participant("b", second, 2)) == second.public_key()
    assert "IDENTITY CHANGED: b re-enrolled (generation 1 -> 2" in caplog.text
    assert pins.all()["b"].fingerprint == fingerprint(second)
    (tmp_path / "peers.json").write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        pins.identity(_participant("b", second, 2))


def test_status_works_offline_and_makes_no_key(tmp_path: Path, capsys) -> None:
    args = [
        "status", "--coordinator-url", "https://nowhere.invalid", "--work-dir", str(tmp_path),
        "--data-kind", "synthetic", "--data-samples", "30",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "(not enrolled yet)" in out and "none yet" in out and "https://nowhere.invalid" in out
    assert not (tmp_path / "identity.key").exists()
    identity = load_or_create_identity(tmp_path)
    JobKeys(tmp_path).load_or_create(7)
    assert (tmp_path / "jobs" / "job-7" / "recipient.key").stat().st_mode & 0o777 == 0o600
    assert main(args) == 0
    out = capsys.readouterr().out
    assert format_fingerprint(fingerprint(identity)) in out
    assert re.search(r"per-job keys:\s+job-7", out)
    assert JobKeys(tmp_path).forget(7) and JobKeys(tmp_path).held() == []


def test_a_turn_in_a_mode_this_agent_was_not_configured_with_is_refused_saying_so() -> None:
    """Only the modes of the agent's own extra_modes run: before anything is built, the
    turn is reported failed, naming the mode and the setting."""
    from hospital_agent.turns import TurnTaker

    class Coordinator:
        reasons: ClassVar[list[tuple[int, int, str]]] = []

        def report_problem(self, *, job: int, turn: int, reason: str) -> dict:
            self.reasons.append((job, turn, reason))
            return {}

    taker = object.__new__(TurnTaker)  # nothing else of it is reached
    taker.coordinator = Coordinator()
    described = {"version": 1, "mode": "elsewhere"}
    assignment = Assignment({"job": 3, "description": described, "turn": {"id": 8, "round": 0}})
    assert taker.take(assignment) is None
    ((job, turn, reason),) = Coordinator.reasons
    assert (job, turn) == (3, 8)
    assert "unknown mode 'elsewhere'" in reason
    assert "extra_modes (MEDSPLIT_AGENT_EXTRA_MODES)" in reason


def test_a_job_description_of_another_version_is_refused_saying_so() -> None:
    """An assignment whose description this agent does not read fails the turn, naming
    the version, before anything is built."""
    from hospital_agent.turns import TurnTaker

    class Coordinator:
        reasons: ClassVar[list[tuple[int, int, str]]] = []

        def report_problem(self, *, job: int, turn: int, reason: str) -> dict:
            self.reasons.append((job, turn, reason))
            return {}

    taker = object.__new__(TurnTaker)  # nothing else of it is reached
    taker.coordinator = Coordinator()
    described = {"version": 5, "mode": "vanilla", "layers": 12}
    assignment = Assignment({"job": 4, "description": described, "turn": {"id": 9, "round": 0}})
    assert taker.take(assignment) is None
    ((job, turn, reason),) = Coordinator.reasons
    assert (job, turn) == (4, 9)
    assert "version: version 5 is not one this party reads (it reads 1, 2, 3, 4)" in reason


def _factory_job(factory: str) -> dict:
    """A job description naming the factory model ``factory`` (``tests.model_modules``)."""
    from medsplit.training.description import JobDescription
    from tests.model_modules import ARGS

    return JobDescription(
        model=factory,
        model_args=ARGS,
        spatial_dims=2,
        in_channels=1,
        num_classes=2,
        input_shape=(1, 28, 28),
        cuts=("pool1",),
    ).to_json()


def test_a_factory_model_from_a_module_this_agent_does_not_list_is_refused_before_import(
    tmp_path: Path, monkeypatch
) -> None:
    """Only the modules of the agent's own model_modules are imported: a job naming a
    factory in another one fails its turn, naming the module and the setting, and the
    module was never imported (its marker file is not there)."""
    from hospital_agent.turns import MODEL_MODULES_SETTING, TurnTaker
    from tests.model_modules import listed, marked_module

    class Coordinator:
        reasons: ClassVar[list[tuple[int, int, str]]] = []

        def report_problem(self, *, job: int, turn: int, reason: str) -> dict:
            self.reasons.append((job, turn, reason))
            return {}

    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    described = _factory_job(marked.factory)
    taker = object.__new__(TurnTaker)  # nothing else of it is reached
    taker.coordinator = Coordinator()
    assignment = Assignment({"job": 5, "description": described, "turn": {"id": 10, "round": 0}})
    with listed(["monai", "lab.models"], setting=MODEL_MODULES_SETTING):
        assert taker.take(assignment) is None
        with pytest.raises(UnknownModelError, match=marked.module):
            assignment.model().build()  # however it is reached, the build refuses too
    ((job, turn, reason),) = Coordinator.reasons
    assert (job, turn) == (5, 10)
    assert f"model module {marked.module!r} is not allowed here" in reason
    assert "add it to the agent's model_modules (MEDSPLIT_AGENT_MODEL_MODULES)" in reason
    assert not marked.imported()


def test_a_job_s_model_is_cut_before_its_turn_comes_and_never_from_an_unlisted_module(
    tmp_path: Path, monkeypatch
) -> None:
    """``warm`` traces the split the turn will use (off the hand-over's path); what may not
    be built here is left alone (its module never imported) for the turn to report."""
    from hospital_agent.turns import MODEL_MODULES_SETTING, TurnTaker
    from medsplit.training.description import JobDescription
    from medsplit.training.setup import hospital_segments, hospital_split
    from tests.model_modules import listed, marked_module

    described = JobDescription(
        model="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=2,
        input_shape=(1, 28, 28),
        cuts=("pool1",),
        seed=uuid.uuid4().int % 2**31,  # a job of its own: not cut before in this process
    )
    assignment = Assignment({"job": 11, "description": described.to_json(), "turn": None})
    taker = object.__new__(TurnTaker)  # nothing else of it is reached
    config = assignment.config()
    key = (assignment.model(), config.cuts, hospital_segments(config))
    before = hospital_split.cache_info()
    taker.warm(assignment)
    assert hospital_split.cache_info().misses == before.misses + 1
    hospital_split(*key)  # the turn's own call finds it cut
    assert hospital_split.cache_info().hits == before.hits + 1

    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = _factory_job(marked.factory)
    with listed(["monai"], setting=MODEL_MODULES_SETTING):
        taker.warm(Assignment({"job": 12, "description": factory, "turn": None}))
    assert not marked.imported()


def test_the_agent_builds_its_model_and_config_from_the_description() -> None:
    from medsplit.training.description import JobDescription

    described = JobDescription(
        model="small_cnn",
        spatial_dims=2,
        in_channels=1,
        num_classes=3,
        input_shape=(1, 28, 28),
        cuts=("pool1",),
        batch_size=8,
        seed=5,
    )
    assignment = Assignment({"job": 7, "description": described.to_json()})
    assert assignment.description() == described
    assert assignment.config() == described.training_config("job-7")
    assert assignment.model() == described.job_model()
    assert assignment.mode == "vanilla"


def test_an_answer_is_trimmed_after_all_of_it_not_between_its_assignments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ended, then one whose turn runs: the turn starts without a trim before
    it (the trim and the fresh pages of its first step were part of every hand-over)."""
    from hospital_agent import service
    from hospital_agent.config import load_config

    config = load_config(
        file=None,
        flags={},
        env={
            "MEDSPLIT_AGENT_COORDINATOR_URL": "http://127.0.0.1:9",
            "MEDSPLIT_AGENT_WORK_DIR": str(tmp_path),
            "MEDSPLIT_AGENT_DATA_KIND": "synthetic",
            "MEDSPLIT_AGENT_DATA_SAMPLES": "8",
        },
    )
    agent = service.Agent(config)
    events: list[str] = []
    monkeypatch.setattr(service, "release_freed_memory", lambda: events.append("trim"))
    monkeypatch.setattr(
        agent, "_handle", lambda taker, assignment: events.append(f"job {assignment.job}")
    )
    ended = {"job": 1, "name": "ended", "state": "completed", "turn": None}
    running = {"job": 2, "name": "running", "state": "running", "turn": {"status": "running"}}
    agent._handle_answer(None, [ended, running])  # type: ignore[arg-type]
    assert events == ["job 1", "job 2", "trim"]
    agent._handle_answer(None, [])  # type: ignore[arg-type]  # unchanged: nothing to give back
    assert events == ["job 1", "job 2", "trim"]


def test_final_weights_not_sealed_yet_are_no_error(caplog) -> None:
    """Once a job completes, each participant looks for the last turn's seal at every
    answer until it is recorded: not finding it yet is routine, not an error; a turn that
    waited for its start in vain is."""
    import threading

    from hospital_agent.turns import TurnTaker

    taker = object.__new__(TurnTaker)  # nothing else of it is reached
    taker.me, taker.stopping = "here", threading.Event()
    source = {"hospital": "last", "turn": 9, "ciphertext_sha256": None}
    assignment = Assignment({"job": 13, "state": "completed", "handoff_from": source})
    with caplog.at_level(logging.INFO, logger="hospital_agent.turns"):
        assert taker.start_state(assignment, None, None, wait=0.0, final=True) is None
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "not recorded yet" in record.getMessage()
    caplog.clear()
    taker.stopping.set()  # a turn's wait, cut short
    with caplog.at_level(logging.INFO, logger="hospital_agent.turns"):
        assert taker.start_state(assignment, None, None, wait=30.0) is None
    (record,) = caplog.records
    assert (
        record.levelno == logging.ERROR and "no hand-off from last arrived" in record.getMessage()
    )
