"""Runs a whole job over a relay with TurnServer and TurnClient, in threads of one process.

Each turn's server runs in a thread (it may be "killed" and replaced, or paused); the
hospitals run in the calling thread. The result is compared with unsplit training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from medsplit.channel import Channel
from medsplit.cutting import SplitModel, split_model
from medsplit.data import DataSplit
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import (
    ClientOutcome,
    ClientReport,
    Directive,
    MemoryCheckpointStore,
    MemorySnapshots,
    ServerOutcome,
    TurnClient,
    TurnIds,
    TurnProgress,
    TurnServer,
)
from tests.redis_server import session_keys


class SimulatedCrash(Exception):
    """Raised inside a server thread to end it as a killed process would: no goodbye."""


@dataclass
class ScriptedHooks:
    """Hooks that crash, pause or stop at given steps, and record what they saw."""

    crash_at: set[int] = field(default_factory=set)
    pause_at: set[int] = field(default_factory=set)
    stop_at: set[int] = field(default_factory=set)
    steps_seen: list[int] = field(default_factory=list)
    finished: list[dict[str, float]] = field(default_factory=list)
    resumes: list[tuple[int, str]] = field(default_factory=list)
    _current: int = 0

    def directive(self) -> Directive:
        if self._current in self.pause_at:
            self.pause_at.discard(self._current)
            return Directive.PAUSE
        if self._current in self.stop_at:
            return Directive.STOP
        return Directive.RUN

    def progress(self, progress: TurnProgress) -> None:
        self._current = progress.steps
        self.steps_seen.append(progress.steps)
        if progress.steps in self.crash_at:
            self.crash_at.discard(progress.steps)
            raise SimulatedCrash(f"killed after step {progress.steps}")

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        self.finished.append(dict(metrics))

    def resumed(self, step: int, reason: str) -> None:
        self.resumes.append((step, reason))


@dataclass
class RelayJob:
    """Server and hospitals' state of a job run over a channel."""

    split: SplitModel
    config: TrainingConfig
    server_state: bytes
    client_state: bytes
    outcomes: list[ServerOutcome] = field(default_factory=list)
    resumed_at: list[list[int]] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    #: Each completed turn's ε spent so far at its hospital (``None``: no activation noise).
    spent: list[dict[str, float | int] | None] = field(default_factory=list)

    def state_dict(self) -> dict[str, torch.Tensor]:
        server = self.server_party()
        import_parties(self.server_state, {"server": server})
        clients = self.client_parties()
        import_parties(self.client_state, clients)
        merged = dict(server.module.state_dict())
        for party in clients.values():
            merged.update(party.module.state_dict())
        return merged

    def server_party(self) -> Party:
        return server_party(self.split, self.config)

    def client_parties(self) -> dict[str, Party]:
        return client_parties(self.split, self.config)


def run_over_relay(
    model: torch.nn.Module,
    splits: list[DataSplit],
    config: TrainingConfig,
    channel: Channel,
    *,
    vals: list[DataSplit | None] | None = None,
    hooks_for: Callable[[int, int], ScriptedHooks] | None = None,
    checkpoint_every: int = 3,
    timeout: float = 30.0,
    num_classes: int = 2,
) -> RelayJob:
    """Every round and turn of the job; servers crash or pause as ``hooks_for`` scripts.
    Both sides check every frame against the turn's limits (``num_classes`` classes)."""
    split = split_model(model, splits[0].images[:2], config.cuts)
    job = RelayJob(split, config, b"", b"")
    job.server_state = export_parties({"server": job.server_party()})
    job.client_state = export_parties(job.client_parties())
    vals = vals or [None] * len(splits)
    for round_ in range(config.rounds):
        for position, data in enumerate(splits):
            ids = TurnIds(config.job, round_, position, config.mode, config.codec)
            streams = session_keys().streams(config.job, f"h{position}")
            store = MemoryCheckpointStore(job.server_state)
            hooks = hooks_for(round_, position) if hooks_for else ScriptedHooks()
            val = vals[position]
            limits = turn_limits(
                config,
                num_classes=num_classes,
                train=len(data),
                val=len(val) if val else 0,
                label_shape=tuple(data.labels.shape[1:]),  # a class, or a mask
            )
            client = TurnClient(
                ids=ids,
                channel=channel,
                streams=streams,
                split=split,
                parties=job.client_parties,
                start=job.client_state,
                config=config,
                train=data,
                val=val,
                snapshots=MemorySnapshots(),
                reply_timeout=timeout,
                limits=limits,
            )
            reports: list[ClientReport] = []

            def take_part(client: TurnClient = client, reports: list = reports) -> None:
                while True:  # a paused turn is taken up again when a server resumes it
                    reports.append(client.run())
                    if reports[-1].outcome != ClientOutcome.PAUSED:
                        return

            hospital = threading.Thread(target=take_part, daemon=True)
            hospital.start()
            crashed = False
            while True:
                party = job.server_party()
                server = TurnServer(
                    ids=ids,
                    channel=channel,
                    streams=streams,
                    split=split,
                    party=party,
                    store=store,
                    hooks=hooks,
                    limits=limits,
                    loss_fn=config.loss_fn(),
                    hospital=f"h{position}",
                    checkpoint_every=checkpoint_every,
                    silence_timeout=timeout,
                    poll_interval=0.05,
                    reset_streams=crashed,
                )
                try:
                    outcome = server.run()
                except SimulatedCrash:
                    crashed = True
                    continue  # a new server takes the turn over from the last checkpoint
                job.outcomes.append(outcome)
                if outcome != ServerOutcome.PAUSED:
                    break
            hospital.join(timeout)
            assert not hospital.is_alive(), "the hospital did not see the end of its turn"
            job.resumed_at.append([s for r in reports for s in r.resumed_at])
            if outcome == ServerOutcome.STOPPED:
                assert reports[-1].outcome == ClientOutcome.STOPPED
                return job
            assert reports[-1].outcome == ClientOutcome.COMPLETED
            job.server_state = export_parties({"server": party})
            job.client_state = client.state()
            job.metrics.append(reports[-1].metrics)
            job.spent.append(reports[-1].privacy_spent)
    return job
