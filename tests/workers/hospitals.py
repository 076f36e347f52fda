"""Plays the hospitals of a job with the core library's client role, until the agent
(hospital_agent/) exists: turns in the job's order, each hospital on its own data."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from django.db import connections

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.data import DataSplit, synthetic_segmentation_split, synthetic_split
from medsplit.errors import ChannelError
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import client_parties, server_party
from medsplit.training.tasks import SEGMENTATION
from medsplit.turns import ClientOutcome, ClientReport, MemorySnapshots, TurnClient, TurnIds
from medsplit.turns.server import SERVER_PARTY
from medsplit.turns.stores import read_verified
from training.models import Job, Turn
from training.runs import checkpoint_dir
from workers.turn_runner import job_model

logger = logging.getLogger(__name__)


def report_sizes(job: Job, train: list[DataSplit], val: list[DataSplit | None]) -> None:
    """Each participant reports its split sizes, as an agent's heartbeat would: the worker
    checks the hospital's frames against them (the turn's steps, the validation size)."""
    participants = job.participants.order_by("position").select_related("hospital")
    for participant, own, held_out in zip(participants, train, val, strict=True):
        hospital = participant.hospital
        hospital.dataset_summary = {
            **(hospital.dataset_summary or {}),
            "split_sizes": {"train": len(own), "val": len(held_out) if held_out else 0},
        }
        hospital.save(update_fields=["dataset_summary"])


def local_data(job: Job, samples: int) -> list[DataSplit]:
    """Each participant's own synthetic images, of the job's input shape (with masks, for
    a segmentation job)."""
    described = job.job_description()
    shape = described.input_shape
    make = synthetic_segmentation_split if described.task == SEGMENTATION else synthetic_split
    return [
        make(samples, shape=shape, num_classes=described.num_classes, seed=100 + i)
        for i in range(job.participants.count())
    ]


@dataclass
class Hospitals:
    """Every participant of ``job``, taking its turns in order in a background thread.

    ``client`` builds each turn's :class:`TurnClient` from its keyword arguments (a test
    may hand one hospital a hostile one); with ``go_on_when_stopped`` a stopped turn (a
    failed or skipped one) is left behind and the next hospital takes its turn.
    """

    job: Job
    redis_url: str
    train: list[DataSplit]
    val: list[DataSplit | None]
    reply_timeout: float = 60.0
    client: Callable[..., TurnClient] = TurnClient
    go_on_when_stopped: bool = False
    #: Seconds each hospital waits before each frame it sends: a test that must act while
    #: the job runs (a pause from the dashboard) gets seconds to do it in, instead of
    #: stopping a process, which may hold a row lock the action needs.
    send_delay: float = 0.0
    reports: list[ClientReport] = field(default_factory=list)
    relay_errors: list[str] = field(default_factory=list)
    resumed_at: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.config = self.job.training_config()
        self.split = job_model(self.job).split(self.config)
        self.slugs = list(
            self.job.participants.order_by("position").values_list("hospital__slug", flat=True)
        )
        report_sizes(self.job, self.train, self.val)
        self.client_state = export_parties(client_parties(self.split, self.config))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.done = threading.Event()

    def start(self) -> Hospitals:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the hospitals did not finish within {timeout} s")
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            for round_ in range(self.config.rounds):
                for position, slug in enumerate(self.slugs):
                    self._turn(round_, position, slug)
        except BaseException as e:  # reported by join()
            self.error = e
        finally:
            connections.close_all()  # this thread's, so that the test database can go
            self.done.set()

    def _channel(self) -> RedisChannel:
        if self.send_delay:
            return _SlowChannel(self.redis_url, delay=self.send_delay)
        return RedisChannel(self.redis_url)

    def _completed_at_the_server(self, round_: int, position: int) -> bool:
        return Turn.objects.filter(
            job=self.job, round__index=round_, position=position, status=Turn.Status.COMPLETED
        ).exists()

    def _turn(self, round_: int, position: int, slug: str) -> None:
        config = self.config
        train, val = self.train[position], self.val[position]
        client = self.client(
            ids=TurnIds(config.job, round_, position, config.mode, config.codec),
            channel=self._channel(),
            streams=relay_keys().streams(config.job, slug),
            split=self.split,
            parties=lambda: client_parties(self.split, config),
            start=self.client_state,
            config=config,
            train=train,
            val=val,
            snapshots=MemorySnapshots(),
            reply_timeout=self.reply_timeout,
            limits=turn_limits(
                config,
                num_classes=self.job.job_description().num_classes,
                train=len(train),
                val=len(val) if val is not None else 0,
                label_shape=self.job.job_description().label_shape,
            ),
        )
        while True:
            try:
                report = client.run()
            except ChannelError as e:
                # The relay went away (Redis restarted): come back with a fresh
                # connection; the server's next handshake says where to resume.
                self.relay_errors.append(str(e))
                logger.info("hospital %s: relay failed (%s); retrying", slug, e)
                time.sleep(0.5)
                if self._completed_at_the_server(round_, position):
                    # The relay went as the server ended the turn: every step was applied
                    # and the metrics sent, only the "done" was lost. A hello now would wait
                    # for a server that is gone, past the next turn's silence timeout (as
                    # an agent, asking the coordinator, would not).
                    self.client_state = client.state()
                    self.resumed_at[(round_, position)] = client.resumed_at
                    return
                client.channel.close()
                client.channel = self._channel()
                continue
            self.reports.append(report)
            self.resumed_at[(round_, position)] = client.resumed_at
            if report.outcome == ClientOutcome.COMPLETED:
                self.client_state = client.state()
                return
            if report.outcome == ClientOutcome.STOPPED:
                if self.go_on_when_stopped:
                    return
                raise _Stopped(f"turn {position} of round {round_} was stopped")

    # -- what the job produced ------------------------------------------------------------

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The server's weights (from the job's checkpoint) with the hospitals' last state."""
        self.job.refresh_from_db()
        row = self.job.server_checkpoint
        assert row is not None, "the job kept no server checkpoint"
        server = server_party(self.split, self.config)
        import_parties(
            read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: server}
        )
        clients = client_parties(self.split, self.config)
        import_parties(self.client_state, clients)
        merged = dict(server.module.state_dict())
        for party in clients.values():
            merged.update(party.module.state_dict())
        return merged

    def unsplit_weights(self) -> dict[str, torch.Tensor]:
        model = job_model(self.job).build()
        return train_unsplit(model, self.train, self.config, self.split).state_dict()


class _SlowChannel(RedisChannel):
    """A hospital's channel that waits ``delay`` seconds before each frame it sends."""

    def __init__(self, url: str, *, delay: float) -> None:
        super().__init__(url)
        self.delay = delay

    def send(self, stream: str, payload: bytes) -> None:
        time.sleep(self.delay)
        super().send(stream, payload)


class _Stopped(Exception):
    pass


def assert_exact(hospitals: Hospitals) -> None:
    got, want = hospitals.trained_weights(), hospitals.unsplit_weights()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), (
            f"{name} differs from unsplit training ({differences(got, want)}; "
            f"seed {hospitals.config.seed})"
        )


def differences(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> str:
    """Which tensors differ and by how much: a rounding slip differs by ~1e-7 in a few,
    a lost or repeated step (or other initial weights) by far more, in all."""
    differing = {
        name: float((got[name].double() - value.double()).abs().max())
        for name, value in want.items()
        if not torch.equal(got[name], value)
    }
    return f"{len(differing)} of {len(want)} tensors differ, at most by " + ", ".join(
        f"{name} {diff:.3g}" for name, diff in differing.items()
    )
