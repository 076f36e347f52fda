"""A small consortium of real agent processes for the fault tests.

A relay of the test's own that can be killed and started again empty (its users kept in
an ACL file, as ``deploy/redis-start.sh`` keeps them, optionally serving TLS), hospitals
enrolled by real ``medsplit-agent`` processes on synthetic images, a small job, and the
checks every fault test makes: exactness against unsplit training, every hand-off
recorded, the audit log's account of what happened.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from audit.models import AuditEvent
from hospital_agent.data import DataSource, load_local, prepare
from hospitals import services as hospital_services
from hospitals.models import Hospital
from kernel.actors import Actor
from medsplit.channel.redis import GROUP
from medsplit.data import DataSplit
from medsplit.protocol.handoff import import_parties
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import job_batches
from medsplit.training.setup import client_parties, server_party
from medsplit.training.verify import deterministic
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from tests.workers.hospitals import differences
from tests.workers.processes import (
    REPO,
    Processes,
    free_port,
    redis_server_binary,
    wait_until,
)
from training import services
from training.models import HandOff, Job, Turn
from training.runs import checkpoint_dir
from training.states import JobState
from workers.turn_runner import job_model

SHAPE = (1, 28, 28)
#: Images per hospital, a tenth kept for validation: 9 training steps of 16 (the last 7).
SAMPLES = 150
VAL_FRACTION = 0.1
BATCH = 16


# -- TLS ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsortiumCA:
    """A consortium CA of the test's own and one server certificate it signed."""

    ca: Path
    cert: Path
    key: Path


def make_ca(folder: Path, addresses: Sequence[str]) -> ConsortiumCA:
    """A CA and a certificate for ``addresses`` (IPs), as a consortium's private CA makes
    them for its relay and coordinator (docs/deploy.md, "TLS")."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "medsplit-test-consortium-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "medsplit-test-server")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = ConsortiumCA(folder / "consortium-ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    return files


# -- the relay ---------------------------------------------------------------------------


@dataclass
class Relay:
    """The relay as deployed: ``deploy/redis-start.sh`` (users in an ACL file the
    provisioner saves to, so the hospitals' and the workers' users survive a restart; no
    data kept; the memory backstops; the admin's password). Plain on ``port`` for the
    coordinator and the workers; with ``tls``, TLS on ``tls_port`` too, for the agents
    (docs/deploy.md, "TLS")."""

    folder: Path
    tls: ConsortiumCA | None = None
    bind: tuple[str, ...] = ("127.0.0.1",)
    port: int = field(default_factory=free_port)
    tls_port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The coordinator's (admin) URL."""
        return f"redis://default:{self.password}@127.0.0.1:{self.port}/0"

    def tls_url(self, host: str) -> str:
        """The relay as agents reach it over TLS (what the coordinator hands them)."""
        return f"rediss://{host}:{self.tls_port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", *self.bind, "--dir", str(self.folder)]
        if self.tls is not None:
            args += [
                *("--tls-port", str(self.tls_port)),
                *("--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)),
                *("--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no"),
            ]
        env = {
            **os.environ,
            "REDIS_PASSWORD": self.password,
            "REDIS_ACL_FILE": str(self.folder / "users.acl"),
            "REDIS_SERVER": redis_server_binary(),
            "REDIS_MAXMEMORY": "512mb",
        }
        log = open(self.folder / "relay.log", "ab")  # noqa: SIM115 - the process keeps it
        # The script execs redis-server: this process is the relay itself.
        self.process = subprocess.Popen(
            ["sh", str(REPO / "deploy" / "redis-start.sh"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError((self.folder / "relay.log").read_text()[-2000:])
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
        finally:
            client.close()
        raise RuntimeError(f"the relay on port {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: everything but its users (in the ACL file) is gone."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def restart(self) -> float:
        """Kill it and start it again empty; the seconds it was away."""
        began = time.monotonic()
        self.kill()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@contextmanager
def running(relay: Relay) -> Iterator[Relay]:
    """Start ``relay``; stop it whatever happens."""
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()


class RelayTrigger:
    """Watches every command the relay runs (``MONITOR``) and calls ``action`` once, from
    its own thread, on the first line that ``matches``.

    So a relay restart lands at a chosen point of a turn (handshake, mid-step, between
    steps, hand-off). Lines are matched as raw bytes, without parsing them: a frame's line
    is hundreds of kilobytes, and the action must come within the milliseconds a step's
    computing takes.
    """

    def __init__(
        self, url: str, matches: Callable[[bytes], bool], action: Callable[[], None]
    ) -> None:
        self.matches = matches
        self.action = action
        self.fired = threading.Event()
        self.error: BaseException | None = None
        # No socket timeout: MONITOR is silent while the relay is idle (redis-py's default
        # of 5 s would end the watch); RESP2, whose replies are plain lines.
        self._client = redis.Redis.from_url(url, socket_timeout=None, protocol=2)
        self._conn = self._client.connection_pool.get_connection()
        self._conn.send_command("MONITOR")
        self._conn.read_response()  # +OK: watching from here on
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            while True:
                line = self._conn.read_response()
                if isinstance(line, bytes) and self.matches(line):
                    self.action()
                    self.fired.set()
                    return
        except (redis.RedisError, OSError):
            pass  # the relay went away (the action killed it, or the test ended)
        except BaseException as e:  # reported by wait()
            self.error = e

    def wait(self, what: str, timeout: float, processes: Processes) -> None:
        wait_until(what, lambda: self.fired.is_set() or self.error, timeout, processes)
        assert self.error is None, f"watching the relay failed: {self.error!r}"


def _quoted(text: str) -> bytes:
    """``text`` inside an argument as MONITOR prints it (quotes escaped)."""
    return text.replace('"', '\\"').encode()


def frame_written(kind: str, stream: str, step: int | None = None) -> Callable[[bytes], bool]:
    """A MONITOR line appending a ``kind`` frame (of ``step``) to a stream whose name
    contains ``stream`` (``:hospital:<slug>:``): a frame's metadata is plain JSON at the
    start of its bytes."""
    kind_field = _quoted(f'"kind":"{kind}"')
    step_field = _quoted(f'"step":"{step}"')

    def matches(line: bytes) -> bool:
        at = line.find(b'"XADD" "')
        if at < 0 or line.find(stream.encode(), at, at + 300) < 0:
            return False
        return kind_field in line and (step is None or step_field in line)

    return matches


def command_on(command: str, key: str) -> Callable[[bytes], bool]:
    """A MONITOR line running ``command`` on a key containing ``key``."""
    head = f'"{command}" "'.encode()

    def matches(line: bytes) -> bool:
        at = line.find(head)
        return at >= 0 and line.find(key.encode(), at, at + 300) >= 0

    return matches


class FrameTaken:
    """A MONITOR line by which a frame's reader has taken it: the ``XADD`` that
    :func:`frame_written` matches, once the stream's consumer group lists the entry as
    delivered. (A reader blocked on the stream is served as the ``XADD`` runs, which
    MONITOR does not show; one that was not waiting takes it with its next read.)"""

    def __init__(self, url: str, kind: str, stream: str, step: int | None = None) -> None:
        self.written = frame_written(kind, stream, step)
        self.url = url

    def __call__(self, line: bytes) -> bool:
        if not self.written(line):
            return False
        name = line.split(b'"XADD" "', 1)[1].split(b'"', 1)[0].decode()
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            # The frame is the stream's newest entry; taken once the group delivered it
            # (a message the reader took before it still pending proves nothing).
            ((newest, _),) = client.xrevrange(name, count=1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.ResponseError):  # no group yet
                    delivered = [
                        _entry_id(g["last-delivered-id"])
                        for g in client.xinfo_groups(name)
                        if g["name"] == GROUP.encode()
                    ]
                    if delivered and delivered[0] >= _entry_id(newest):
                        return True
                time.sleep(0.001)
        finally:
            client.close()
        raise AssertionError(f"nobody took the frame written to {name} within 30 s")


def _entry_id(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as numbers, to compare."""
    ms, seq = entry_id.split(b"-")
    return int(ms), int(seq)


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """``pid`` stopped (SIGSTOP) for the body, as a process busy computing is: it holds no
    Redis command open, so it meets what changed only at its next one."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# -- hospitals and their agents ----------------------------------------------------------


@dataclass
class Agents:
    """Hospitals enrolled by real agent processes, each on its own synthetic images."""

    processes: Processes
    coordinator: str
    folder: Path
    hospitals: list[Hospital] = field(default_factory=list)
    env: dict[str, dict[str, str]] = field(default_factory=dict)

    def enrol(
        self,
        admin: Actor,
        count: int,
        *,
        prefix: dict[int, list[str]] | None = None,
        coordinator: dict[int, str] | None = None,
        extra: dict[str, str] | None = None,
        own: dict[int, dict[str, str]] | None = None,
    ) -> Agents:
        """Register ``count`` hospitals and start an agent for each (agent ``i`` under
        ``prefix[i]``, e.g. ``ip netns exec NAME``, reaching ``coordinator[i]``, with its
        own settings ``own[i]`` over the common ones)."""
        tag = uuid.uuid4().hex[:6]
        for i in range(count):
            registration = hospital_services.hospital_register(
                actor=admin, name=f"Hospital {tag} {i}", slug=f"h{tag}-{i}"
            )
            self.hospitals.append(registration.hospital)
            self.env[f"agent-{i}"] = {
                **self.processes.env,
                "MEDSPLIT_AGENT_COORDINATOR_URL": (coordinator or {}).get(i, self.coordinator),
                "MEDSPLIT_AGENT_WORK_DIR": str(self.folder / f"agent-{i}"),
                "MEDSPLIT_AGENT_ENROLMENT_CODE": registration.enrolment_code.plaintext,
                "MEDSPLIT_AGENT_DATA_KIND": "synthetic",
                "MEDSPLIT_AGENT_DATA_SAMPLES": str(SAMPLES),
                "MEDSPLIT_AGENT_DATA_SEED": str(10 + i),
                "MEDSPLIT_AGENT_DATA_VAL_FRACTION": str(VAL_FRACTION),
                "MEDSPLIT_AGENT_POLL_SECONDS": "2",
                "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "1",
                "MEDSPLIT_AGENT_REPLY_TIMEOUT": "120",
                **(extra or {}),
                **(own or {}).get(i, {}),
            }
            self.start(i, (prefix or {}).get(i, []))
        wait_until(
            "every agent to enrol and report its data",
            lambda: (
                Hospital.objects.filter(pk__in=[h.pk for h in self.hospitals], status="enrolled")
                .exclude(dataset_summary={})
                .count()
                == count
            ),
            90,
            self.processes,
        )
        return self

    def start(self, i: int, prefix: Sequence[str] = ()) -> None:
        """(Re)start agent ``i`` with its work directory: its key, token and snapshots."""
        self.processes.start(
            f"agent-{i}",
            [*prefix, sys.executable, "-m", "hospital_agent", "run"],
            env=self.env[f"agent-{i}"],
        )

    def trains(self, job: Job) -> list[DataSplit]:
        """Each hospital's training split, exactly as its agent reads and splits it."""
        model = job_model(job)
        splits = []
        for i in range(len(self.hospitals)):
            source = DataSource(kind="synthetic", samples=SAMPLES, seed=10 + i, shape=SHAPE)
            data, _ = load_local(
                source,
                input_shape=model.input_shape,
                num_classes=model.num_classes,
                val_fraction=VAL_FRACTION,
                seed=10 + i,
            )
            prepared = prepare(data, input_shape=model.input_shape, num_classes=model.num_classes)
            splits.append(prepared.train)
        return splits

    def final(self, job: Job, i: int) -> Path:
        return self.folder / f"agent-{i}" / "jobs" / f"job-{job.pk}" / "final.safetensors"


def small_job(admin: Actor, hospitals: Sequence[Hospital], **overrides) -> Job:
    """A scheduled small_cnn job over ``hospitals`` in order: vanilla, batch 16, 9 steps
    a turn, SGD with momentum at the hospitals, Adam at the server, codec ``none``."""
    data = {
        "name": f"faults {uuid.uuid4().hex[:6]}",
        "model": "small_cnn",
        "num_classes": 2,
        "mode": "vanilla",
        "cuts": ["pool1"],
        "client_optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "server_optimizer": {"name": "adam", "lr": 0.001},
        "batch_size": BATCH,
        "rounds": 1,
        "seed": uuid.uuid4().int % 1000,
        "on_failure": "retry",
        "max_retries": 2,
        "participants": [{"hospital": h.slug} for h in hospitals],
        **overrides,
    }
    job = services.job_create(actor=admin, data=data)
    return services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin)


def job_state(job: Job) -> str:
    job.refresh_from_db()
    return job.state if job.state in (JobState.COMPLETED, JobState.FAILED) else ""


def wait_completed(processes: Processes, job: Job, agents: Agents, timeout: float) -> None:
    """Until the job has completed and every agent holds its final weights."""
    state = wait_until("the job to end", lambda: job_state(job), timeout, processes)
    assert state == JobState.COMPLETED, f"{job.state_reason}\n{processes.logs()}"
    wait_until(
        "every agent to keep the final weights",
        lambda: all(agents.final(job, i).exists() for i in range(len(agents.hospitals))),
        60,
        processes,
    )


def assert_exact(
    job: Job,
    agents: Agents,
    *,
    hospitals: Sequence[int] | None = None,
    skipped: frozenset[int] = frozenset(),
) -> None:
    """The job's server weights and the final weights of ``hospitals`` (default: all)
    equal unsplit training over the same batches (``torch.equal``): no step lost, none
    applied twice. The turns of ``skipped`` positions count for nothing."""
    job.refresh_from_db()
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    trains = agents.trains(job)
    batches = [b for b in job_batches(config, trains) if b.hospital not in skipped]
    with deterministic():
        want = train_unsplit(model.build(), trains, config, split, batches=batches).state_dict()
    server = server_party(split, config)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server})
    for i in range(len(agents.hospitals)) if hospitals is None else hospitals:
        clients = client_parties(split, config)
        import_parties(agents.final(job, i).read_bytes(), clients)
        got = dict(server.module.state_dict())
        for party in clients.values():
            got.update(party.module.state_dict())
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert torch.equal(got[name], value), (
                f"agent {i}: {name} differs from unsplit training ({differences(got, want)}; "
                f"seed {config.seed}; {restarts(job)})"
            )


def restarts(job: Job) -> str:
    """Each turn's runs and resumptions, as the audit log tells them: where to look first
    when a job's weights are not unsplit training's."""
    events = audit(job, "turn.resumed", "turn.run_interrupted")
    told = [f"{e.action} {e.target} {e.details}" for e in events]
    return "turns resumed or interrupted: " + ("; ".join(told) if told else "none")


def assert_every_handoff_recorded(job: Job) -> None:
    """Each completed turn handed its weights to every other participant, once."""
    participants = job.participants.count()
    for turn in Turn.objects.filter(job=job, status=Turn.Status.COMPLETED):
        recipients = HandOff.objects.filter(turn=turn).values_list("recipient_id", flat=True)
        assert len(recipients) == len(set(recipients)) == participants - 1, (
            f"turn {turn.pk} ({turn.hospital.slug}, round {turn.round.index}) recorded "
            f"hand-offs to {len(recipients)} of {participants - 1} participants"
        )


def audit(job: Job, *actions: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(job_id=job.pk, action__in=actions).order_by("pk"))


def needs_tcp(redis_url: str) -> None:
    if not redis_url.startswith("redis://"):
        pytest.skip("per-hospital Redis users need a Redis reached over TCP")


def open_consortium(live_server, settings, redis_url: str, **medsplit: object) -> str:
    """The live coordinator on ``redis_url`` with the real relay's per-hospital users (and
    the ``medsplit`` settings over its own); its URL."""
    needs_tcp(redis_url)
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": redis_url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        **medsplit,
    }
    from django.core.cache import cache

    cache.clear()  # the live server's throttles: every agent enrols from 127.0.0.1
    return live_server.url


@pytest.fixture
def consortium(live_server, settings, redis_url: str) -> str:
    """:func:`open_consortium` with the coordinator's own settings."""
    return open_consortium(live_server, settings, redis_url)


# -- the coordinator behind TLS ------------------------------------------------------------


def tls_server_block(*, listen: str, upstream: str, ca: ConsortiumCA) -> str:
    """docs/deploy.md's nginx server block ("TLS"), with this test's addresses and files."""
    return f"""
    server {{
        listen {listen} ssl;
        ssl_certificate     {ca.cert};
        ssl_certificate_key {ca.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        add_header Strict-Transport-Security "max-age=31536000" always;
        client_max_body_size 1m;
        location / {{
            proxy_pass http://{upstream};
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_read_timeout 60s;
        }}
    }}"""


@dataclass
class TlsProxy:
    """Debian's nginx terminating TLS in front of the coordinator, as docs/deploy.md sets
    it up: ``https://<host>:<port>`` with the consortium CA's certificate."""

    folder: Path
    host: str
    upstream: str
    ca: ConsortiumCA
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def start(self) -> None:
        from tests.security.proxy import nginx_binary

        temp = self.folder / "nginx-temp"
        temp.mkdir(parents=True, exist_ok=True)
        paths = "\n".join(
            f"    {kind}_temp_path {temp / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        user = "user root;\n" if os.geteuid() == 0 else ""  # else nobody: no way into tmp
        block = tls_server_block(
            listen=f"{self.host}:{self.port}", upstream=self.upstream, ca=self.ca
        )
        config = self.folder / "nginx.conf"
        config.write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {self.folder / 'nginx.pid'};\n"
            f"error_log {self.folder / 'nginx-error.log'} info;\n"
            "events { worker_connections 512; }\n"
            f"http {{\n    access_log {self.folder / 'nginx-access.log'};\n{paths}\n{block}\n}}\n"
        )
        log = open(self.folder / "nginx.log", "ab")  # noqa: SIM115 - the process keeps it
        self.process = subprocess.Popen(
            [nginx_binary(), "-p", str(self.folder), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "nginx-error.log").read_text()
            try:
                requests.get(self.url + "/", verify=str(self.ca.ca), timeout=2)
                return
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer at {self.url}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
