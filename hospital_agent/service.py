"""The agent's life: enrol once (an agent enrolled before identity keys moves to one, once),
then heartbeat, long-poll for assignments and take turns, until SIGTERM (or a revoked
token) stops it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent import __version__
from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import (
    Backoff,
    Coordinator,
    CoordinatorError,
    CoordinatorRefused,
    TokenRefused,
)
from hospital_agent.data import DataProblem, DataSummary, check_data, load_vertical
from hospital_agent.data.testset import (
    NO_TEST_SET,
    check_test,
    local_test_source,
    vertical_test_source,
    with_test,
)
from hospital_agent.enrolment import enrol, move_to_identity_key
from hospital_agent.identity import load_credentials, load_or_create_identity
from hospital_agent.relay import HandoffMissing
from hospital_agent.turns import ENDED, MODEL_MODULES_SETTING, Assignment, TurnTaker
from hospital_agent.witness import Mismatch, Witness
from medsplit.errors import ConfigError, MedSplitError
from medsplit.models import set_model_modules
from medsplit.modes import load_extra_modes, mode_paths
from medsplit.protocol.keys import fingerprint, format_fingerprint
from medsplit.runtime import (
    freeze_start_up,
    keep_freed_memory,
    release_freed_memory,
    set_deterministic,
)

logger = logging.getLogger(__name__)
#: Seconds between polls the coordinator answered at once without a change (it was
#: holding as many long-polls as it allows): gives its threads to people meanwhile.
_BUSY_POLL_PAUSE = 2.0

#: The status of an agent whose local data cannot be used; it keeps heartbeating.
DATA_PROBLEM = "data_problem"
#: Heartbeats between two looks at data found broken (fixed by someone meanwhile?).
DATA_RECHECK_BEATS = 10

#: Exit codes of ``medsplit-agent run``.
EXIT_OK, EXIT_CONFIG, EXIT_REFUSED = 0, 2, 3


class Agent:
    """One hospital's agent (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.stopping = threading.Event()
        self.status = "starting"
        self.summary: dict[str, Any] | None = None
        self.data_problem = ""
        self.started_at = datetime.now(UTC).isoformat()
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
        use_deterministic_kernels(self.config.deterministic)
        keep_freed_memory()  # a step's buffers reuse the last step's pages (medsplit.runtime)
        freeze_start_up()  # its imports are never walked again, at exit neither
        # This agent's own configuration is the only place new mode or model code comes
        # from (a factory model's module is imported only when listed here).
        load_extra_modes(mode_paths(self.config.extra_modes))
        set_model_modules(self.config.model_modules, setting=MODEL_MODULES_SETTING)
        identity = load_or_create_identity(self.config.work_dir)
        credentials = load_credentials(self.config.work_dir) or enrol(
            self.config, identity, stopping=self.stopping
        )
        coordinator = Coordinator(
            self.config.coordinator_url,
            token=credentials.token,
            ca_bundle=self.config.ca_bundle,
            backoff=Backoff(give_up_after=None),  # keep trying until stopped
            stopping=self.stopping,
        )
        if credentials.identity_generation == 0:
            credentials = move_to_identity_key(self.config, coordinator, identity, credentials)
        self._check_data()
        logger.info(
            "agent of %s %s, coordinator %s, identity %s",
            credentials.hospital,
            __version__,
            coordinator.url,
            format_fingerprint(fingerprint(identity)),
        )
        taker = TurnTaker(
            config=self.config,
            credentials=credentials,
            identity=identity,
            coordinator=coordinator,
            stopping=self.stopping,
            on_status=self._set_status,
            on_data_problem=self.data_failed,
        )
        witness = ChainWitness(
            Witness(self.config.work_dir), coordinator, identity, credentials.hospital
        )
        beating = threading.Thread(
            target=self._heartbeats, args=(coordinator, witness), daemon=True
        )
        if self.status not in ("error", DATA_PROBLEM):
            self.status = "idle"
        beating.start()
        etag = ""
        while not self.stopping.is_set():
            asked, known = time.monotonic(), etag
            try:
                assignments, etag = coordinator.assignments(
                    wait=self.config.poll_seconds, etag=etag
                )
            except CoordinatorError as e:
                if isinstance(e, CoordinatorRefused):
                    raise
                logger.warning("%s", e)
                continue
            self._handle_answer(taker, assignments)
            if etag == known and time.monotonic() - asked < self.config.poll_seconds / 2:
                # Unchanged long before the wait ran out: the coordinator had no thread
                # free to hold the poll. Ask again a little later, not at once.
                self.stopping.wait(min(_BUSY_POLL_PAUSE, self.config.poll_seconds))
        if self._refused is not None:
            raise self._refused
        logger.info("stopped")
        return EXIT_OK

    def _handle_answer(self, taker: TurnTaker, assignments: list[dict[str, Any]]) -> None:
        """Act on one poll answer, assignment by assignment, then give what their work
        freed back to the system (the steps inside a turn keep reusing their pages).

        Once per answer, after all of it: trimming between two assignments (a job that
        ended, then one whose turn runs) put the trim (about 3 ms) and the fresh pages of
        the turn's first step (2-3 ms more) into every hand-over."""
        for raw in assignments:
            if self.stopping.is_set():
                break
            self._handle(taker, Assignment(raw))
        if assignments:
            release_freed_memory()

    def _handle(self, taker: TurnTaker, assignment: Assignment) -> None:
        raw = assignment.raw
        try:
            sources = [
                raw.get("handoff_from") or {},
                *(raw.get("start_from") or {}).get("sources", []),
            ]
            if any(source.get("hospital") == taker.me for source in sources):
                # This hospital's blobs are the ones the next turn (or, once the job has
                # completed, every participant) starts from: a relay that restarted and
                # lost them gets them back.
                taker.relay.restore_handoffs(assignment.job_name)
            if raw["state"] in ENDED:
                taker.finish(assignment)
                if raw["state"] != "completed":
                    taker.relay.forget_handoffs(assignment.job_name)
                elif (raw.get("evaluation") or {}).get("status") == "running":
                    taker.evaluate(assignment)
                if raw["state"] == "completed":
                    # A vertical job's label party asking for predictions (a no-op else).
                    taker.answer_prediction(assignment)
                return
            taker.prepare(assignment)
            if raw["state"] == "running" and raw["turn"] and raw["turn"]["status"] == "running":
                taker.take(assignment)
            elif raw["state"] == "running" and _owes_submission(raw, taker.me):
                taker.submit_secure(assignment)
            else:
                taker.warm(assignment)  # its turn is still to come
        except (HandoffMissing, CoordinatorError) as e:
            if isinstance(e, TokenRefused):
                raise
            logger.warning("job %s: %s", assignment.job, e)
        except MedSplitError as e:
            logger.error("job %s: %s: %s", assignment.job, type(e).__name__, e)
            self.stopping.wait(5.0)  # the coordinator's policy decides; don't spin

    def _set_status(self, status: str) -> None:
        self.status = status

    def _check_data(self) -> None:
        """Read the local data and keep its summary, or the problem with it (the file
        and the check, never pixel values): the heartbeat reports one or the other."""
        source = self.config.data
        try:
            if source.kind == "table" or source.identifiers_csv:
                # Records with identifiers, for vertical jobs: the parties split them together.
                self.summary = with_test(
                    load_vertical(source).summary(), self._check_vertical_test()
                ).to_json()
            else:
                pool = check_data(
                    source, val_fraction=self.config.val_fraction, seed=self.config.split_seed
                )
                self.summary = with_test(pool, self._check_test()).to_json()
        except DataProblem as e:
            if self.data_problem != str(e):
                logger.error("local data cannot be used: %s", e)
            self.summary, self.data_problem = None, str(e)
            self.status = DATA_PROBLEM
            return
        release_freed_memory()  # the check's temporaries; the turn loads its own copy
        if self.data_problem:
            logger.info("the local data can be used again")
            self.status = "idle"
        self.data_problem = ""

    def _check_test(self) -> DataSummary | None:
        """The local test set's summary; ``None``: it has none ("no test set").

        Raises:
            DataProblem: it is configured but cannot be used (naming the test set).
        """
        test = local_test_source(self.config.data, self.config.test)
        if test is None:
            logger.info("%s: this hospital is left out of the evaluation of jobs", NO_TEST_SET)
            return None
        try:
            return check_test(test)
        except DataProblem as e:
            raise DataProblem.one(None, f"the test set: {e}") from e

    def _check_vertical_test(self) -> DataSummary | None:
        """A vertical party's test records' summary (counts only); ``None``: none.

        Raises:
            DataProblem: they are configured but cannot be read (naming the test set).
        """
        test = vertical_test_source(self.config.data, self.config.test)
        if test is None:
            return None
        try:
            return load_vertical(test).summary()
        except DataProblem as e:
            raise DataProblem.one(None, f"the test set: {e}") from e

    def data_failed(self, problem: str) -> None:
        """A turn found the data broken: the next heartbeats say so (and the summary goes)."""
        self.summary, self.data_problem, self.status = None, problem, DATA_PROBLEM

    def _heartbeats(self, coordinator: Coordinator, witness: ChainWitness) -> None:
        beats = 0
        while not self.stopping.is_set():
            beats += 1
            if self.data_problem and beats % DATA_RECHECK_BEATS == 0:
                self._check_data()  # fixed meanwhile?
            try:
                answer = coordinator.heartbeat(
                    status=self.status,
                    version=__version__,
                    summary=self.summary,
                    data_problem=self.data_problem,
                    started_at=self.started_at,
                )
                witness.saw(answer.get("audit_head"))
            except TokenRefused as e:
                self._refused = e
                self.stop()
                return
            except CoordinatorError as e:
                logger.warning("heartbeat: %s", e)
            self.stopping.wait(self.config.heartbeat_seconds)


def _owes_submission(raw: dict, me: str) -> bool:
    """Whether the assignment's secure aggregation attempt waits for this hospital."""
    aggregation = raw.get("aggregation") or {}
    return (
        aggregation.get("status") == "collecting"
        and me in (aggregation.get("weights") or {})
        and me not in (aggregation.get("submitted") or {})
    )


def use_deterministic_kernels(on: bool) -> None:
    """Deterministic kernels only, as the workers use (``MEDSPLIT_DETERMINISTIC``), so a
    job's weights equal unsplit training bit for bit on cuda too (invariant 1). cuBLAS needs
    its workspace set before CUDA starts, hence the variable, set first. Set without
    importing TorchInductor (``medsplit.runtime.set_deterministic``): the agent never
    compiles, and that import alone was 70 MiB of its resident memory."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_deterministic(on)


class ChainWitness:
    """Ties :class:`Witness` to the coordinator: the heads of heartbeat answers, the
    checks every few heartbeats, and one signed report per mismatch found."""

    def __init__(
        self, witness: Witness, coordinator: Coordinator, identity: MLDSA65PrivateKey, me: str
    ) -> None:
        self.witness = witness
        self.coordinator = coordinator
        self.identity = identity
        self.me = me
        self._reported: Mismatch | None = None

    def saw(self, head: dict[str, Any] | None) -> Mismatch | None:
        """Keep ``head``; when a check is due, run it and report what it finds."""
        if not self.witness.saw(head):
            return None
        return self.check()

    def check(self) -> Mismatch | None:
        try:
            mismatch = self.witness.check(self._links)
        except (CoordinatorError, ConfigError, KeyError, TypeError, ValueError) as e:
            logger.warning("could not check the audit chain: %s", e)
            return None
        if mismatch is not None and mismatch != self._reported:
            statement, signature = self.witness.signed(self.identity, self.me, mismatch)
            self.coordinator.report_witness(statement=statement, signature=signature)
            self._reported = mismatch
        return mismatch

    def _links(self, after: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        answer = self.coordinator.audit_chain(after=after)
        return answer["links"], answer["head"]
