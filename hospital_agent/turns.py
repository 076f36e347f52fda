"""Taking a turn: the weights to start from, training through the relay, handing on.

One :class:`TurnTaker` per agent. For each assignment whose turn is running it:

1. loads and checks the local data for the job's input shape (a problem is reported to
   the coordinator as a failed precondition naming the file, and the turn is given up);
2. gets the state to start from: the job's seed on the very first turn, its own last
   state when it took the last turn itself, else the blob the last hospital sealed for
   it on the relay (checked against the coordinator's record, then opened);
3. trains with :class:`medsplit.turns.TurnClient` over its streams, with snapshots on
   disk, so a restarted agent continues where it was; a frame of the server that fails
   a check (non-finite or ill-shaped gradients, say) is applied to nothing and reported
   to the coordinator, which fails the turn attempt with that reason;
4. seals its new state for every other participant and records each blob's hash.

When a job has ended it fetches the final weights sealed for it (or keeps its own) and
stores them in its work directory.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from tqdm import tqdm

from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import Coordinator, CoordinatorError, TokenRefused
from hospital_agent.data import DataProblem, LocalData, load_local, prepare
from hospital_agent.identity import Credentials, write_private
from hospital_agent.relay import Relay
from hospital_agent.snapshots import FileSnapshots
from medsplit.channel import RelayKeys
from medsplit.cutting import SplitModel
from medsplit.errors import ChannelError
from medsplit.modes import Mode
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.roles import StepResult
from medsplit.protocol.sealing import SealContext
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel, cached_split, client_parties
from medsplit.turns import ClientOutcome, TurnClient, TurnIds

logger = logging.getLogger(__name__)


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class Assignment:
    """An assignment as the coordinator sent it, with what the agent derives from it."""

    raw: dict[str, Any]

    @property
    def job(self) -> int:
        return int(self.raw["job"])

    @property
    def job_name(self) -> str:
        return f"job-{self.job}"

    @property
    def relay_keys(self) -> RelayKeys:
        """The deployment's relay key layout, as the coordinator names it."""
        return RelayKeys(self.raw.get("relay_prefix") or RelayKeys().prefix)

    def config(self) -> TrainingConfig:
        r = self.raw
        return TrainingConfig(
            cuts=tuple(r["cuts"]),
            mode=Mode(r["mode"]),
            client_optimizer=OptimizerConfig.from_json(r["client_optimizer"]),
            batch_size=r["batch_size"],
            local_epochs=r["local_epochs"],
            max_steps_per_turn=r["max_steps_per_turn"],
            rounds=r["rounds"],
            codec=r["codec"],
            seed=r["seed"],
            job=self.job_name,
        )

    def model(self) -> JobModel:
        r = self.raw
        return JobModel(
            name=r["model"],
            spatial_dims=r["spatial_dims"],
            in_channels=r["in_channels"],
            num_classes=r["num_classes"],
            input_shape=tuple(r["input_shape"]),
            seed=r["seed"],
        )

    def others(self, me: str) -> list[dict[str, Any]]:
        """The other participants in turn order from ``me`` on: the hospital whose turn
        comes next first, so that it waits for one seal, not for all of them."""
        participants = self.raw["participants"]  # in turn order (the coordinator's)
        mine = [i for i, p in enumerate(participants) if p["hospital"] == me]
        start = mine[0] + 1 if mine else 0
        return [p for p in participants[start:] + participants[:start] if p["hospital"] != me]


def report_refusal(
    coordinator: Coordinator, *, job: int, turn_id: int, refusal: FrameRejected
) -> None:
    """The server sent a frame that failed a check, and nothing of it was applied: have
    the coordinator fail the turn attempt with that reason (else the worker would wait
    for this hospital until its silence timeout, and the reason would be lost)."""
    logger.error("job %s: turn given up: %s", job, refusal)
    try:
        coordinator.report_problem(job=job, turn=turn_id, reason=str(refusal))
    except CoordinatorError as e:
        if isinstance(e, TokenRefused):
            raise
        # The turn may have ended meanwhile (the worker's own checks, a cancel).
        logger.warning("job %s: the refusal could not be reported: %s", job, e)


class TurnTaker:
    """Takes this hospital's turns (see the module docstring)."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        credentials: Credentials,
        key: X25519PrivateKey,
        coordinator: Coordinator,
        stopping: threading.Event,
        on_status: Callable[[str], None] = lambda status: None,
    ) -> None:
        self.config = config
        self.me = credentials.hospital
        self.key = key
        self.coordinator = coordinator
        self.relay = Relay(credentials, ca_bundle=config.ca_bundle)
        self.stopping = stopping
        self.on_status = on_status
        self._data: dict[tuple, LocalData] = {}

    def jobs_dir(self, job: int) -> Path:
        return self.config.work_dir / "jobs" / f"job-{job}"

    # -- a turn -----------------------------------------------------------------------

    def take(self, assignment: Assignment) -> ClientOutcome | None:
        """Take the running turn of ``assignment``; ``None`` if it could not start."""
        turn = assignment.raw["turn"]
        job, model, config = assignment.job, assignment.model(), assignment.config()
        try:
            data = self.data_for(model)
        except DataProblem as e:
            logger.error("job %s: local data cannot be used: %s", job, e)
            self.coordinator.report_problem(job=job, turn=turn["id"], reason=str(e))
            return None
        split = cached_split(model, config.cuts)
        start = self.start_state(assignment, config, split, wait=self.config.reply_timeout)
        if start is None:
            return None
        ids = TurnIds(
            config.job, turn["round"], assignment.raw["position"], config.mode, config.codec
        )
        folder = self.jobs_dir(job) / f"round-{turn['round']}-position-{ids.position}"
        bar = tqdm(total=None, desc=f"job {job} round {turn['round']}", unit="step", leave=False)

        def on_step(result: StepResult) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{result.loss:.4f}")

        client = TurnClient(
            ids=ids,
            channel=self.relay.channel(),
            streams=assignment.relay_keys.streams(config.job, self.me),
            split=split,
            parties=lambda: client_parties(split, config),
            start=start,
            config=config,
            train=data.train,
            val=data.val if len(data.val) else None,
            snapshots=FileSnapshots(folder),
            reply_timeout=self.config.reply_timeout,
            on_step=on_step,
            stop=self.stopping,
            device=self.config.device,
            limits=turn_limits(
                config, num_classes=model.num_classes, train=len(data.train), val=len(data.val)
            ),
        )
        bar.total = client.train_steps
        self.on_status("busy")
        logger.info(
            "job %s round %s: my turn (%d training steps, %d validation batches)",
            job,
            turn["round"],
            client.train_steps,
            client.eval_steps,
        )
        try:
            outcome = self._run(client)
        except FrameRejected as e:
            report_refusal(self.coordinator, job=job, turn_id=turn["id"], refusal=e)
            return ClientOutcome.STOPPED
        finally:
            bar.close()
            client.channel.close()
            self.on_status("idle")
        if outcome == ClientOutcome.COMPLETED:
            self.hand_on(assignment, turn, client.state())
        return outcome

    def _run(self, client: TurnClient) -> ClientOutcome:
        delay = 1.0
        while True:
            try:
                report = client.run()
            except ChannelError as e:
                if self.stopping.is_set():
                    return ClientOutcome.INTERRUPTED
                logger.warning("relay: %s; reconnecting in %.0f s", e, delay)
                client.channel.close()
                self.stopping.wait(delay)
                delay = min(delay * 2, 60.0)
                client.channel = self.relay.channel()
                continue
            if report.outcome == ClientOutcome.PAUSED:
                logger.info("the job is paused; waiting for it to resume")
                continue  # the next run waits for the server's handshake
            if report.outcome == ClientOutcome.COMPLETED:
                metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(report.metrics.items()))
                steps = max(report.steps, 1)
                logger.info(
                    "turn done: %s; per step %.1f ms waiting on the relay, %.1f ms computing; "
                    "peak memory %.0f MiB",
                    metrics,
                    1000 * report.waiting_seconds / steps,
                    1000 * report.computing_seconds / steps,
                    peak_rss_mib(),
                )
            return report.outcome

    def data_for(self, model: JobModel) -> LocalData:
        """The local data fitted to the job's input shape (read once per shape)."""
        shape = (model.input_shape, model.num_classes)
        if shape not in self._data:
            data, _ = load_local(
                self.config.data,
                input_shape=model.input_shape,
                num_classes=model.num_classes,
                val_fraction=self.config.val_fraction,
                seed=self.config.split_seed,
            )
            self._data[shape] = prepare(
                data, input_shape=model.input_shape, num_classes=model.num_classes
            )
        return self._data[shape]

    # -- hand-offs ----------------------------------------------------------------------

    def start_state(
        self,
        assignment: Assignment,
        config: TrainingConfig,
        split: SplitModel | None,
        *,
        wait: float,
    ) -> bytes | None:
        """The training state the next turn starts from (see the module docstring)."""
        source = assignment.raw["handoff_from"]
        if source is None:
            split = split or assignment.model().split(config)
            return export_parties(client_parties(split, config))
        if source["hospital"] == self.me:
            return (self.jobs_dir(assignment.job) / "state.safetensors").read_bytes()
        deadline = time.monotonic() + wait
        while source["ciphertext_sha256"] is None:  # the sender is still sealing
            if time.monotonic() > deadline or self.stopping.wait(1.0):
                logger.error(
                    "job %s: no hand-off from %s arrived", assignment.job, source["hospital"]
                )
                return None
            fresh, _ = self.coordinator.assignments()
            match = [a for a in fresh if a["job"] == assignment.job]
            if not match or match[0]["handoff_from"] is None:
                return None
            source = match[0]["handoff_from"]
        return self.relay.take_handoff(
            keys=assignment.relay_keys,
            job=assignment.job_name,
            key=self.key,
            sender=source["hospital"],
            sender_public_key=source["public_key"],
            context=SealContext(
                job=assignment.job_name,
                round=source["round"],
                sender=source["hospital"],
                recipient=self.me,
            ),
            expected_sha256=source["ciphertext_sha256"],
            wait=max(0.0, deadline - time.monotonic()),
            stopping=self.stopping,
        )

    def hand_on(self, assignment: Assignment, turn: dict[str, Any], state: bytes) -> None:
        """Keep this state, and seal it for every other participant."""
        write_private(self.jobs_dir(assignment.job) / "state.safetensors", state)
        for other in assignment.others(self.me):
            context = SealContext(
                job=assignment.job_name,
                round=turn["round"],
                sender=self.me,
                recipient=other["hospital"],
            )
            digest, size = self.relay.put_handoff(
                keys=assignment.relay_keys,
                job=assignment.job_name,
                state=state,
                key=self.key,
                recipient=other["hospital"],
                recipient_public_key=other["public_key"],
                context=context,
            )
            self.coordinator.record_handoff(
                job=assignment.job,
                turn=turn["id"],
                recipient=other["hospital"],
                ciphertext_sha256=digest,
                size_bytes=size,
            )
        logger.info(
            "job %s: weights sealed for %d other participant(s)",
            assignment.job,
            len(assignment.others(self.me)),
        )

    def keep_final(self, assignment: Assignment) -> Path | None:
        """Once the job completed: store the final weights (sealed for this hospital by
        whoever took the last turn) as ``final.safetensors``; ``None`` if not there yet."""
        path = self.jobs_dir(assignment.job) / "final.safetensors"
        if path.exists():
            return path
        config = assignment.config()
        state = self.start_state(assignment, config, None, wait=0.0)
        if state is None:
            return None
        write_private(path, state)
        logger.info("job %s completed: final weights saved to %s", assignment.job, path)
        return path
