"""The agent's life: enrol once, then heartbeat, long-poll for assignments and take turns,
until SIGTERM (or a revoked token) stops it."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from hospital_agent import __version__
from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import (
    Backoff,
    Coordinator,
    CoordinatorError,
    CoordinatorRefused,
    TokenRefused,
)
from hospital_agent.data import DataProblem, check_data
from hospital_agent.identity import (
    Credentials,
    load_credentials,
    load_or_create_key,
    save_credentials,
)
from hospital_agent.relay import HandoffMissing
from hospital_agent.turns import Assignment, TurnTaker
from medsplit.errors import ConfigError, MedSplitError
from medsplit.protocol.sealing import public_key_b64

logger = logging.getLogger(__name__)

#: Exit codes of ``medsplit-agent run``.
EXIT_OK, EXIT_CONFIG, EXIT_REFUSED = 0, 2, 3


class Agent:
    """One hospital's agent (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.stopping = threading.Event()
        self.status = "starting"
        self.summary: dict[str, Any] | None = None
        self._refused: TokenRefused | None = None

    def stop(self, *_: object) -> None:
        """Finish the step in flight, keep a snapshot, and leave (SIGTERM, SIGINT)."""
        if not self.stopping.is_set():
            logger.info("stopping: finishing the step in flight")
        self.stopping.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        try:
            return self._run()
        except TokenRefused as e:
            logger.error(
                "%s. This agent's token was revoked or is unknown: ask the consortium for a "
                "new enrolment code and start the agent with it.",
                e,
            )
            return EXIT_REFUSED
        except (ConfigError, CoordinatorRefused) as e:
            logger.error("%s", e)
            return EXIT_CONFIG

    def _run(self) -> int:
        self.config.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = load_or_create_key(self.config.work_dir)
        credentials = load_credentials(self.config.work_dir) or self._enrol(key)
        coordinator = Coordinator(
            self.config.coordinator_url,
            token=credentials.token,
            ca_bundle=self.config.ca_bundle,
            backoff=Backoff(give_up_after=None),  # keep trying until stopped
            stopping=self.stopping,
        )
        try:
            self.summary = check_data(
                self.config.data, val_fraction=self.config.val_fraction, seed=self.config.split_seed
            ).to_json()
        except DataProblem as e:
            logger.error("local data cannot be used: %s", e)
            self.status = "error"
        logger.info(
            "agent of %s %s, coordinator %s", credentials.hospital, __version__, coordinator.url
        )
        taker = TurnTaker(
            config=self.config,
            credentials=credentials,
            key=key,
            coordinator=coordinator,
            stopping=self.stopping,
            on_status=self._set_status,
        )
        beating = threading.Thread(target=self._heartbeats, args=(coordinator,), daemon=True)
        if self.status != "error":
            self.status = "idle"
        beating.start()
        etag = ""
        while not self.stopping.is_set():
            try:
                assignments, etag = coordinator.assignments(
                    wait=self.config.poll_seconds, etag=etag
                )
            except CoordinatorError as e:
                if isinstance(e, CoordinatorRefused):
                    raise
                logger.warning("%s", e)
                continue
            for raw in assignments:
                if self.stopping.is_set():
                    break
                self._handle(taker, Assignment(raw))
        if self._refused is not None:
            raise self._refused
        logger.info("stopped")
        return EXIT_OK

    def _handle(self, taker: TurnTaker, assignment: Assignment) -> None:
        raw = assignment.raw
        try:
            if raw["state"] == "running" and raw["turn"] and raw["turn"]["status"] == "running":
                taker.take(assignment)
            elif raw["state"] == "completed":
                taker.keep_final(assignment)
        except (HandoffMissing, CoordinatorError) as e:
            if isinstance(e, TokenRefused):
                raise
            logger.warning("job %s: %s", assignment.job, e)
        except MedSplitError as e:
            logger.error("job %s: %s: %s", assignment.job, type(e).__name__, e)
            self.stopping.wait(5.0)  # the coordinator's policy decides; don't spin

    def _set_status(self, status: str) -> None:
        self.status = status

    def _heartbeats(self, coordinator: Coordinator) -> None:
        while not self.stopping.is_set():
            if self.summary is not None:
                try:
                    coordinator.heartbeat(
                        status=self.status, version=__version__, summary=self.summary
                    )
                except TokenRefused as e:
                    self._refused = e
                    self.stop()
                    return
                except CoordinatorError as e:
                    logger.warning("heartbeat: %s", e)
            self.stopping.wait(self.config.heartbeat_seconds)

    def _enrol(self, key) -> Credentials:
        if not self.config.enrolment_code:
            raise ConfigError(
                "this agent is not enrolled yet: give it the one-time enrolment code from the "
                "consortium (enrolment_code, MEDSPLIT_AGENT_ENROLMENT_CODE or --enrolment-code)"
            )
        coordinator = Coordinator(
            self.config.coordinator_url, ca_bundle=self.config.ca_bundle, stopping=self.stopping
        )
        answer = coordinator.enrol(code=self.config.enrolment_code, public_key=public_key_b64(key))
        relay = answer["relay"]
        credentials = Credentials(
            hospital=answer["hospital"],
            token=answer["token"]["token"],
            relay_url=relay["url"],
            relay_username=relay["username"],
            relay_password=relay["password"],
        )
        save_credentials(self.config.work_dir, credentials)
        logger.info(
            "enrolled as %s; credentials kept in %s", credentials.hospital, self.config.work_dir
        )
        return credentials
