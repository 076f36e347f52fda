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

Keys: while a job runs it publishes its per-job recipient key for it, signed with its
identity key; it pins every participant's identity (:mod:`hospital_agent.pins`), seals
only to recipient keys signed by the pinned identity, and opens only blobs signed by it.
When a job has ended it fetches the final weights sealed for it (or keeps its own), stores
them in its work directory, and deletes the job's recipient key.
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

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey
from tqdm import tqdm

from hospital_agent.alignment import (
    TRAINING,
    AlignedRecords,
    AlignmentCoordinator,
    AlignmentFailed,
    AlignmentStage,
    align_records,
)
from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import (
    Coordinator,
    CoordinatorError,
    TokenRefused,
)
from hospital_agent.data import (
    DataProblem,
    DataSource,
    LocalData,
    VerticalRecords,
    load_for_job,
    load_vertical,
)
from hospital_agent.data.testset import NO_TEST_SET, load_test_for_job, local_test_source
from hospital_agent.hijack import detected_before, refuse, stop_taking_part
from hospital_agent.identity import Credentials, write_private
from hospital_agent.job_keys import JobKeys
from hospital_agent.leakage import RoundScores, collect_leakage, send_scores
from hospital_agent.loss_report import LossReporter
from hospital_agent.pins import PeerKeyRefused, Pins, check_own_identity
from hospital_agent.privacy_report import TurnPrivacy, report_figures
from hospital_agent.relay import Relay
from hospital_agent.sealed_mail import SealedMail
from hospital_agent.secure_rounds import SecureRounds
from hospital_agent.snapshots import FileSnapshots
from hospital_agent.vertical_eval import (
    NoVerticalTestSet,
    answer_vertical_prediction,
    evaluate_vertical,
)
from hospital_agent.vertical_turns import VerticalTurn, vertical_turn
from medsplit.channel import RelayKeys
from medsplit.cutting import SplitModel
from medsplit.data import DataSplit
from medsplit.defenses.hijack import HijackDetected
from medsplit.errors import ChannelError, ConfigError, MedSplitError, SealError, UnknownModelError
from medsplit.models import require_model_module
from medsplit.modes import Side, StartFrom, require_mode
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.keys import SignedRecipientKey
from medsplit.protocol.roles import StepResult
from medsplit.protocol.sealing import SealContext
from medsplit.psi import PsiError
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel, client_parties, hospital_segments, hospital_split
from medsplit.training.tasks import DEFAULT_TASK
from medsplit.training.vertical_parts import participants_in_order
from medsplit.turns import ClientOutcome, TurnClient, TurnIds
from medsplit.turns.evaluation import evaluation_client
from medsplit.turns.vertical_eval import VerticalEvalFailed

logger = logging.getLogger(__name__)

#: Where this agent's configuration adds modes, for the message of an unknown one.
EXTRA_MODES_SETTING = "the agent's extra_modes (MEDSPLIT_AGENT_EXTRA_MODES)"
#: Where it lists the modules of the MODULE:FACTORY models it builds.
MODEL_MODULES_SETTING = "the agent's model_modules (MEDSPLIT_AGENT_MODEL_MODULES)"

#: The states of a job that has ended: its recipient key is no longer needed.
ENDED = frozenset({"completed", "failed", "cancelled"})


#: The longest the label party waits for a round's label-leakage scores.
LEAKAGE_WAIT_SECONDS = 30.0


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

    def description(self) -> JobDescription:
        """What the job trains and how, as the coordinator stored it.

        Raises:
            JobDescriptionError: not a description this agent reads (another version,
                say); the message names each field.
        """
        return JobDescription.from_json(self.raw["description"])

    @property
    def mode(self) -> str:
        """The job's mode's name, as the description gives it (before it is checked)."""
        described = self.raw.get("description")
        return str(described.get("mode", "")) if isinstance(described, dict) else ""

    def config(self) -> TrainingConfig:
        return self.description().training_config(self.job_name)

    def model(self) -> JobModel:
        return self.description().job_model()

    def participant(self, hospital: str) -> dict[str, Any]:
        """The participant entry of ``hospital``.

        Raises:
            PeerKeyRefused: it is not a participant of the job.
        """
        for p in self.raw["participants"]:
            if p["hospital"] == hospital:
                return p
        raise PeerKeyRefused(f"{hospital} is not a participant of job {self.job}")

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


#: What ends this party's side of a vertical evaluation or prediction here: its data,
#: the alignment, the relay or the server's answers (reported, never raised on).
VERTICAL_PASS_FAILURES = (
    DataProblem, PsiError, AlignmentFailed, SealError, PeerKeyRefused, ChannelError,
    VerticalEvalFailed, FrameRejected, ConfigError, UnknownModelError,
)  # fmt: skip


#: The longest a wait for the previous hospital's seal holds the coordinator's answer.
HANDOFF_POLL_SECONDS = 2.0


def job_folder(work_dir: Path, job: int) -> Path:
    """Where an agent keeps job ``job``'s states, snapshots and final weights."""
    return work_dir / "jobs" / f"job-{job}"


class TurnTaker:
    """Takes this hospital's turns (see the module docstring)."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        credentials: Credentials,
        identity: MLDSA65PrivateKey,
        coordinator: Coordinator,
        stopping: threading.Event,
        on_status: Callable[[str], None] = lambda status: None,
        on_data_problem: Callable[[str], None] = lambda problem: None,
    ) -> None:
        self.config = config
        self.me = credentials.hospital
        self.identity = identity
        self.pins = Pins(config.work_dir)
        self.job_keys = JobKeys(config.work_dir)
        self.coordinator = coordinator
        self.relay = Relay(credentials, ca_bundle=config.ca_bundle)
        self.stopping = stopping
        self.on_status = on_status
        self.on_data_problem = on_data_problem
        self._data: dict[tuple, LocalData] = {}
        self._tests: dict[tuple, DataSplit] = {}
        #: The evaluations this agent took part in (or reported it could not).
        self._evaluated: set[int] = set()
        self.secure = SecureRounds(
            me=self.me,
            identity=identity,
            relay=self.relay,
            coordinator=coordinator,
            pins=self.pins,
            job_keys=self.job_keys,
            folder=self.jobs_dir,
            stopping=stopping,
            wait=config.reply_timeout,
        )

    def jobs_dir(self, job: int) -> Path:
        return job_folder(self.config.work_dir, job)

    # -- a turn -----------------------------------------------------------------------

    def take(self, assignment: Assignment) -> ClientOutcome | None:
        """Take the running turn of ``assignment``; ``None`` if it could not start."""
        turn = assignment.raw["turn"]
        # The hand-over's phases are read off these lines (bench/bench_scaling.py).
        logger.info("job %s round %s: turn %s assigned", assignment.job, turn["round"], turn["id"])
        try:
            described = self._buildable(assignment)
        except (ConfigError, UnknownModelError) as e:  # a mode, a module, a description
            logger.error("job %s: %s", assignment.job, e)
            self.coordinator.report_problem(job=assignment.job, turn=turn["id"], reason=str(e))
            return None
        job, model, config = assignment.job, assignment.model(), assignment.config()
        hijacked = detected_before(self.jobs_dir(job))
        if hijacked is not None:  # no further step of a job whose server hijacked it
            refuse(self.coordinator, job=job, turn_id=turn["id"], reason=hijacked)
            return None
        ids = TurnIds(
            config.job, turn["round"], assignment.raw["position"], config.mode, config.codec
        )
        vertical: VerticalTurn | None = None
        if config.split_mode.feature_sets:
            vertical = self.vertical_turn(assignment, turn, ids)
            if vertical is None:
                return None
            # No validation split: a validation batch would need every party's features.
            empty = DataSplit(vertical.data.images[:0], vertical.data.labels[:0])
            split, start, data = None, vertical.start, LocalData(vertical.data, empty)
        else:
            try:
                data = self.data_for(model, task=config.task)
            except DataProblem as e:
                logger.error("job %s: local data cannot be used: %s", job, e)
                self.on_data_problem(str(e))
                self.coordinator.report_problem(job=job, turn=turn["id"], reason=str(e))
                return None
            split = hospital_split(model, config.cuts, hospital_segments(config))
            try:
                start = self.start_state(assignment, config, split, wait=self.config.reply_timeout)
            except (SealError, PeerKeyRefused) as e:
                # Nothing was loaded; the coordinator's policy decides, with the reason.
                logger.error("job %s: the weights to start from were refused: %s", job, e)
                self.coordinator.report_problem(
                    job=job, turn=turn["id"], reason=f"the hand-off to start from was refused: {e}"
                )
                return None
            if start is None:
                return None
        logger.info("job %s round %s: start state ready", job, turn["round"])
        folder = self.jobs_dir(job) / f"round-{turn['round']}-position-{ids.position}"
        bar = tqdm(total=None, desc=f"job {job} round {turn['round']}", unit="step", leave=False)
        reporter: LossReporter | None = None

        # A passive party of a vertical job scores what it received, as an attacker would.
        scores = RoundScores(ids.round) if vertical and not vertical.label_party else None
        # What this hospital measures of its own exposure in this turn (job's privacy).
        privacy = None
        if split is not None:
            privacy = TurnPrivacy.for_turn(
                job=job,
                round_index=ids.round,
                rounds=config.rounds,
                options=described.privacy,
                config=config,
                split=split,
                work_dir=self.config.work_dir,
            )

        def on_step(result: StepResult) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{result.loss:.4f}")
            if reporter is not None:
                reporter.saw(result.ids.step + 1, result.loss)
            received = getattr(client.role, "received", None)
            if scores is not None and received is not None:
                scores.saw(result.ids.step, received)

        try:
            make_client = privacy.turn_client if privacy is not None else TurnClient
            client = make_client(
                ids=ids,
                channel=self.relay.channel(),
                streams=assignment.relay_keys.streams(config.job, self.me),
                split=split,  # type: ignore[arg-type]
                parties=vertical.parties if vertical else lambda: client_parties(split, config),
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
                    config,
                    num_classes=model.num_classes,
                    train=len(data.train),
                    val=len(data.val),
                    label_shape=assignment.description().label_shape,
                ),
                role=vertical.role if vertical else None,
                batches=vertical.batches if vertical else None,
            )
        except ConfigError as e:  # the job's hijacking check cannot run on this data
            bar.close()
            logger.error("job %s: %s", job, e)
            self.coordinator.report_problem(job=job, turn=turn["id"], reason=str(e))
            return None
        bar.total = client.train_steps
        # Where the loss is computed here, only this agent can tell the dashboard.
        mode = require_mode(config.mode, setting=EXTRA_MODES_SETTING)
        holds_loss = mode.labels == Side.HOSPITAL and (vertical is None or vertical.label_party)
        if self.config.report_loss and holds_loss:
            reporter = LossReporter(
                self.coordinator, job=job, turn=turn["id"], last_step=client.train_steps
            )
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
        except HijackDetected as e:
            stop_taking_part(
                self.coordinator, job=job, turn_id=turn["id"], folder=self.jobs_dir(job), error=e
            )
            return ClientOutcome.STOPPED
        finally:
            bar.close()
            if reporter is not None:
                reporter.close()
            client.channel.close()
            self.on_status("idle")
        if outcome == ClientOutcome.COMPLETED:
            # The attempt it was assigned: the coordinator records the hand-off against the
            # attempt of this place that completed, if the server side was tried again.
            self.hand_on(assignment, turn, client.state())
            if vertical is not None:
                self.audit_leakage(assignment, vertical, ids, scores)
            if privacy is not None:
                self.audit_privacy(privacy, client, data)
        return outcome

    @staticmethod
    def _buildable(assignment: Assignment) -> JobDescription:
        """The job's description, once its mode and models may be built here.

        Raises:
            ConfigError: a mode this agent was not configured with, or a bad description.
            UnknownModelError: a factory model from a module this agent does not list
                (nothing of it is imported).
        """
        require_mode(assignment.mode, setting=EXTRA_MODES_SETTING)
        described = assignment.description()
        # Every party builds every vertical party's model (the join's shapes).
        for name in [described.model, *(f.model.name for f in described.party_fronts())]:
            require_model_module(name)
        return described

    def warm(self, assignment: Assignment) -> None:
        """Cut the job's model as this hospital keeps it before its first turn comes: the
        trace (a tenth of a second for a small network, seconds for a large one) is then
        off the hand-over's path. What cannot be built is left for :meth:`take` to report."""
        try:
            described = self._buildable(assignment)  # read once: this runs at every answer
            config = described.training_config(assignment.job_name)
            if config.split_mode.feature_sets:
                return  # a vertical party builds its front in the turn, from its alignment
            hospital_split(described.job_model(), config.cuts, hospital_segments(config))
        except (ConfigError, UnknownModelError) as e:
            logger.debug("job %s: not cut ahead of the turn: %s", assignment.job, e)

    def evaluate(self, assignment: Assignment) -> ClientOutcome | None:
        """Take part in the running evaluation of the completed job's final model: this
        hospital's test set through its segments (kept in ``final.safetensors``), the
        server segment on a worker (:mod:`medsplit.turns.evaluation`). ``None`` when it
        could not start: no test set, data that does not fit (each reported to the
        coordinator), or the final weights not there yet (tried again at the next poll)."""
        part = assignment.raw.get("evaluation") or {}
        job = assignment.job
        if part.get("status") != "running" or part.get("id") in self._evaluated:
            return None
        try:
            require_mode(assignment.mode, setting=EXTRA_MODES_SETTING)
            require_model_module(assignment.description().model)
        except (ConfigError, UnknownModelError) as e:
            self._evaluation_problem(assignment, part, str(e))
            return None
        if assignment.config().split_mode.feature_sets:
            return self.evaluate_vertical(assignment, part)
        model, config = assignment.model(), assignment.config()
        source = local_test_source(self.config.data, self.config.test)
        if source is None:
            self._evaluation_problem(assignment, part, NO_TEST_SET, no_test_set=True)
            return None
        try:
            test = self.test_for(source, model, task=config.task)
            train = self.data_for(model, task=config.task).train
        except DataProblem as e:
            logger.error("job %s: the test set cannot be used: %s", job, e)
            self._evaluation_problem(assignment, part, f"the test set: {e}")
            return None
        if len(test) != part.get("test_samples"):
            self._evaluation_problem(
                assignment,
                part,
                f"the test set holds {len(test)} images now, not the {part.get('test_samples')} "
                "reported when the evaluation started",
            )
            return None
        final = self.keep_final(assignment)
        if final is None:
            return None  # the final weights are not on the relay yet: at the next poll
        split = hospital_split(model, config.cuts, hospital_segments(config))
        ids = TurnIds(config.job, int(part["round"]), assignment.raw["position"], config.mode)
        client = evaluation_client(
            ids=ids,
            channel=self.relay.channel(),
            streams=assignment.relay_keys.streams(config.job, self.me),
            split=split,
            parties=lambda: client_parties(split, config),
            final_state=final.read_bytes(),
            config=config,
            test=test,
            train_labels=train.labels,
            num_classes=model.num_classes,
            reply_timeout=self.config.reply_timeout,
            device=self.config.device,
            stop=self.stopping,
        )
        logger.info(
            "job %s: evaluating its final model on this hospital's %d test images (%d batches)",
            job,
            len(test),
            client.eval_steps,
        )
        self.on_status("busy")
        try:
            outcome = self._run(client)
        except FrameRejected as e:
            logger.error("job %s: evaluation given up: %s", job, e)
            self._evaluation_problem(assignment, part, str(e))
            return ClientOutcome.STOPPED
        finally:
            client.channel.close()
            self.on_status("idle")
        if outcome != ClientOutcome.INTERRUPTED:
            self._evaluated.add(part["id"])
        return outcome

    def evaluate_vertical(
        self, assignment: Assignment, part: dict[str, Any]
    ) -> ClientOutcome | None:
        """A vertical party's side of the evaluation: every party's test records aligned,
        the joint step on a worker (:mod:`hospital_agent.vertical_eval`)."""
        return self._joint_part(assignment, part, evaluate_vertical, "evaluation")

    def answer_prediction(self, assignment: Assignment) -> ClientOutcome | None:
        """A passive party's side of its label party's running prediction
        (:func:`hospital_agent.vertical_eval.answer_vertical_prediction`); the label
        party's own part is served by its ``medsplit-agent predict``, not here. ``None``:
        nothing to answer."""
        part = assignment.raw.get("prediction") or {}
        order = participants_in_order(assignment.raw["participants"])
        if part.get("status") != "running" or part.get("id") in self._evaluated:
            return None
        if order[0] == self.me:
            return None
        return self._joint_part(assignment, part, answer_vertical_prediction, "prediction")

    def _joint_part(
        self,
        assignment: Assignment,
        part: dict[str, Any],
        side: Callable[[Any, Assignment, dict[str, Any]], Any],
        what: str,
    ) -> ClientOutcome | None:
        """This party's ``side`` of a vertical job's joint pass ``part``; a failure here is
        reported on the part (which stops the worker and the other parties)."""
        self.on_status("busy")
        try:
            side(self, assignment, part)
        except NoVerticalTestSet as e:
            self._evaluation_problem(assignment, part, f"{NO_TEST_SET}: {e}", no_test_set=True)
            return None
        except VERTICAL_PASS_FAILURES as e:
            logger.error("job %s: the vertical %s failed here: %s", assignment.job, what, e)
            self._evaluation_problem(assignment, part, str(e))
            return ClientOutcome.STOPPED
        finally:
            self.on_status("idle")
        self._evaluated.add(part["id"])
        return ClientOutcome.COMPLETED

    def test_for(self, source: DataSource, model: JobModel, *, task: str) -> DataSplit:
        """The local test set fitted to the job's input shape (read once per shape)."""
        shape = ("test", model.input_shape, model.num_classes, task)
        if shape not in self._tests:
            self._tests[shape] = load_test_for_job(
                source,
                input_shape=tuple(model.input_shape),
                num_classes=model.num_classes,
                task=task,
            )
        return self._tests[shape]

    def _evaluation_problem(
        self,
        assignment: Assignment,
        part: dict[str, Any],
        reason: str,
        *,
        no_test_set: bool = False,
    ) -> None:
        self._evaluated.add(part.get("id"))
        try:
            self.coordinator.report_evaluation_problem(
                job=assignment.job,
                evaluation=int(part["id"]),
                reason=reason,
                no_test_set=no_test_set,
            )
        except CoordinatorError as e:
            if isinstance(e, TokenRefused):
                raise
            logger.warning(
                "job %s: the evaluation problem could not be reported: %s", assignment.job, e
            )

    def audit_privacy(self, privacy: TurnPrivacy, client: TurnClient, data: LocalData) -> None:
        """After a turn: this hospital's figures of its own exposure, the picture kept
        here, the numbers reported. The audit never holds training up: a failure is
        logged, and the job goes on."""
        job, round_index = privacy.job, privacy.round_index
        try:
            figures = privacy.figures(client.parties, data, spent=client.spent())
            if figures:
                report_figures(self.coordinator, job=job, round_index=round_index, figures=figures)
                logger.info(
                    "job %s round %s: privacy figures reported: %s",
                    job,
                    round_index,
                    ", ".join(f"{k} {v}" for k, v in figures.items()),
                )
        except (MedSplitError, CoordinatorError) as e:
            if isinstance(e, TokenRefused):
                raise
            logger.warning("job %s round %s: the privacy audit failed: %s", job, round_index, e)

    def audit_leakage(
        self,
        assignment: Assignment,
        vertical: VerticalTurn,
        ids: TurnIds,
        scores: RoundScores | None,
    ) -> None:
        """After a vertical round: a passive party seals its scores for the label party;
        the label party scores them against its labels and reports the AUCs. The audit
        never holds training up: a failure is logged, and the job goes on."""
        order = participants_in_order(assignment.raw["participants"])
        mail = self.sealed_mail(assignment)
        try:
            if scores is not None:
                send_scores(mail, label_party=order[0], scores=scores)
                return
            labels = {b.ids.step: b.y for b in vertical.batches(ids.round)}
            found = collect_leakage(
                mail,
                passive=order[1:],
                round_=ids.round,
                labels=labels,
                # Sent as the passive parties' turns end, with this one's: a party that
                # is down costs the audit, not the next round's start.
                timeout=min(self.config.reply_timeout, LEAKAGE_WAIT_SECONDS),
                stopping=self.stopping,
            )
            missing = sorted(set(order[1:]) - set(found))
            if missing:
                logger.warning(
                    "job %s round %s: no label-leakage scores from %s in time",
                    assignment.job,
                    ids.round,
                    ", ".join(missing),
                )
            if found:
                self.coordinator.report_leakage(
                    job=assignment.job, round_index=ids.round, parties=found
                )
                for party, report in found.items():
                    logger.info(
                        "job %s round %s: label leakage through %s's gradients: norm attack "
                        "AUC %s, cosine attack AUC %s (0.5 is chance)",
                        assignment.job,
                        ids.round,
                        party,
                        report["norm_auc"],
                        report["cosine_auc"],
                    )
        except (MedSplitError, CoordinatorError) as e:
            logger.warning(
                "job %s round %s: the label-leakage audit failed: %s", assignment.job, ids.round, e
            )

    def sealed_mail(self, assignment: Assignment) -> SealedMail:
        """Sealed blobs between this hospital and the job's other participants."""
        return SealedMail(
            relay=self.relay,
            keys=assignment.relay_keys,
            job=assignment.job,
            me=self.me,
            participants=assignment.raw["participants"],
            identity=self.identity,
            pins=self.pins,
            job_keys=self.job_keys,
        )

    def vertical_records(self, assignment: Assignment, source: DataSource) -> VerticalRecords:
        """This party's records of a vertical job in ``source``, read at its own front's
        input shape (a ``table``'s features at none)."""
        model = assignment.model()
        fronts = assignment.description().party_fronts()
        own = {front.party: front.model for front in fronts}.get(self.me, model)
        return load_vertical(
            source,
            input_shape=None if self.config.data.kind == "table" else own.input_shape,
            num_classes=model.num_classes,
        )

    def align_vertical(
        self,
        assignment: Assignment,
        records: VerticalRecords,
        *,
        coordinator: AlignmentCoordinator,
        stage: AlignmentStage = TRAINING,
        minimum: int | None = None,
    ) -> AlignedRecords:
        """``records`` aligned by PSI with the job's other parties' (for ``stage``: the
        training records, an evaluation's test records or a prediction's records, each on
        topics of its own), at least ``minimum`` (default: the job's ``min_records``)."""
        config = assignment.config()
        if minimum is None:
            minimum = int(config.mode_options["min_records"])
        return align_records(
            relay=self.relay,
            keys=assignment.relay_keys,
            coordinator=coordinator,
            job=assignment.job,
            me=self.me,
            participants=assignment.raw["participants"],
            records=records,
            seed=config.seed,
            minimum=minimum,
            identity=self.identity,
            pins=self.pins,
            job_keys=self.job_keys,
            folder=self.jobs_dir(assignment.job),
            timeout=self.config.reply_timeout,
            stopping=self.stopping,
            stage=stage,
        )

    def vertical_turn(
        self, assignment: Assignment, turn: dict[str, Any], ids: TurnIds
    ) -> VerticalTurn | None:
        """A vertical party's turn: its records read and aligned with the other parties'
        (once per job: kept in its folder), its share of the model; ``None``, the
        problem reported to the coordinator, when it cannot start."""
        model, config = assignment.model(), assignment.config()
        fronts = assignment.description().party_fronts()
        try:
            records = self.vertical_records(assignment, self.config.data)
            aligned = self.align_vertical(assignment, records, coordinator=self.coordinator)
            return vertical_turn(
                config=config,
                job_model=model,
                fronts=fronts,
                participants=assignment.raw["participants"],
                me=self.me,
                position=ids.position,
                round_index=ids.round,
                alignment=aligned.alignment,
                features=aligned.features,
                labels=aligned.labels,
                own_state=self.jobs_dir(assignment.job) / "state.safetensors",
            )
        except (
            DataProblem,
            PsiError,
            AlignmentFailed,
            SealError,
            PeerKeyRefused,
            ChannelError,
        ) as e:
            logger.error("job %s: this party's records cannot be aligned or used: %s", ids.job, e)
            if isinstance(e, DataProblem):
                self.on_data_problem(str(e))
            self.coordinator.report_problem(job=assignment.job, turn=turn["id"], reason=str(e))
            return None

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

    def data_for(self, model: JobModel, *, task: str = DEFAULT_TASK) -> LocalData:
        """The local data fitted to the job's input shape (read once per shape), its
        targets checked against the job's task: a mask per image of a segmentation job.

        Raises:
            DataProblem: the data does not fit the job (see :func:`load_local`), or holds
                the targets of another task (labels for a segmentation job, say).
        """
        shape = (model.input_shape, model.num_classes, task)
        if shape not in self._data:
            data, summary = load_for_job(
                self.config.data,
                input_shape=tuple(model.input_shape),
                num_classes=model.num_classes,
                task=task,
                val_fraction=self.config.val_fraction,
                seed=self.config.split_seed,
            )
            if tuple(summary.image_shape) != tuple(model.input_shape):
                # Said out loud: resizing changes what the model sees (and its accuracy).
                logger.warning(
                    "images are %s; they are resized to the job's %s",
                    "x".join(map(str, summary.image_shape)),
                    "x".join(map(str, model.input_shape)),
                )
            self._data[shape] = data
        return self._data[shape]

    # -- keys ---------------------------------------------------------------------------

    def prepare(self, assignment: Assignment) -> None:
        """Before anything else of a running (or scheduled, paused) job: check that the
        coordinator shows this hospital with its own identity, pin every other
        participant's identity at first sight, and publish this hospital's per-job key.

        Raises:
            PeerKeyRefused: the coordinator shows this hospital with another identity key.
        """
        check_own_identity(assignment.participant(self.me), self.identity, job=assignment.job)
        for other in assignment.others(self.me):
            if not other.get("identity_key"):  # enrolled before identity keys, moving soon
                logger.warning(
                    "job %s: %s has no identity key yet; nothing is sealed for it until it has",
                    assignment.job,
                    other["hospital"],
                )
                continue
            try:
                self.pins.identity(other)
            except PeerKeyRefused as e:
                logger.error("job %s: %s", assignment.job, e)
        key = self.job_keys.load_or_create(assignment.job).public()
        shown = assignment.participant(self.me).get("recipient_key") or {}
        if shown.get("key") == key.b64():
            return
        if shown.get("key"):
            logger.warning(
                "job %s: the coordinator holds another per-job key for this hospital "
                "(sha256 %s...) than this agent's (sha256 %s...); publishing this agent's",
                assignment.job,
                shown.get("sha256", "?")[:16],
                key.sha256()[:16],
            )
        signed = SignedRecipientKey.sign(
            job=assignment.job_name, hospital=self.me, key=key, identity=self.identity
        )
        self.coordinator.publish_recipient_key(job=assignment.job, **signed.to_json())
        logger.info(
            "job %s: published this hospital's per-job key (sha256 %s...)",
            assignment.job,
            key.sha256()[:16],
        )

    def finish(self, assignment: Assignment) -> None:
        """A job has ended: keep the final weights (completed), then delete its key."""
        if assignment.raw["state"] == "completed" and self.keep_final(assignment) is None:
            return  # not there yet: the key is still needed to open them
        if assignment.raw["state"] == "completed" and assignment.config().split_mode.feature_sets:
            # A vertical job hands no weights on, so its key opens only its parties' PSI
            # mail; an evaluation (at the end, or asked later) aligns test records with it.
            return
        if self.job_keys.forget(assignment.job):
            logger.info(
                "job %s %s: its per-job key is deleted; no hand-off of it can be opened any more",
                assignment.job,
                assignment.raw["state"],
            )

    def _peer_identity(self, assignment: Assignment, hospital: str) -> MLDSA65PublicKey:
        return self.pins.identity(assignment.participant(hospital))

    # -- hand-offs ----------------------------------------------------------------------

    def start_state(
        self,
        assignment: Assignment,
        config: TrainingConfig,
        split: SplitModel | None,
        *,
        wait: float,
        final: bool = False,
    ) -> bytes | None:
        """The training state the next turn starts from (see the module docstring), as
        the assignment's ``start_from`` says: the previous hospital's hand-off, the job's
        seed, or the job mode's combination of the last group's hand-offs; with
        ``final``, the job's result, as its ``result_from`` says (the last completed
        turn's, or the combination of the last group's).

        Raises:
            SealError: the blob is not what was sealed for this place, or this agent holds
                no key for the job any more.
            PeerKeyRefused: the sender's identity does not fit its pin.
        """
        # The job's result is what its mode says (an older coordinator sends none: the
        # last turn's hand-off, as round-robin).
        start = assignment.raw.get("result_from" if final else "start_from")
        if start is not None and start["kind"] == StartFrom.OWN and start["sources"]:
            # This hospital's own last state, which it kept and sealed for nobody.
            own = self.jobs_dir(assignment.job) / "state.safetensors"
            return own.read_bytes() if own.exists() else None
        if start is not None and start["kind"] != StartFrom.PREVIOUS:
            # The job's mode plans otherwise than a chain of hand-offs.
            split = split or assignment.model().split(config)
            if start["kind"] == StartFrom.AGGREGATE and start.get("aggregation"):
                # Securely aggregated: the average only this hospital (and its peers) unmasks.
                ready = split
                return self.secure.average(
                    job=assignment.job,
                    job_name=assignment.job_name,
                    keys=assignment.relay_keys,
                    aggregation=start["aggregation"],
                    participants=assignment.raw["participants"],
                    fresh=lambda: client_parties(ready, config),
                )
            if start["kind"] == StartFrom.AGGREGATE and start["sources"]:
                return self._combined(assignment, config, split, start["sources"], wait=wait)
            return export_parties(client_parties(split, config))
        source = assignment.raw["handoff_from"]
        if source is None:
            split = split or assignment.model().split(config)
            return export_parties(client_parties(split, config))
        if source["hospital"] == self.me:
            return (self.jobs_dir(assignment.job) / "state.safetensors").read_bytes()
        deadline = time.monotonic() + wait
        etag = ""
        while source["ciphertext_sha256"] is None:  # the sender is still sealing
            if time.monotonic() > deadline or self.stopping.is_set():
                _not_arrived(assignment, source["hospital"], waited=wait > 0)
                return None
            # Held by the coordinator until the assignments change (the hand-off recorded):
            # the turn starts as soon as the seal is there, not at the next poll.
            fresh, etag = self._fresh_when_changed(assignment, etag, deadline)
            if fresh is None or fresh.raw["handoff_from"] is None:
                return None
            assignment, source = fresh, fresh.raw["handoff_from"]
        return self._open(assignment, source, deadline)

    def _combined(
        self,
        assignment: Assignment,
        config: TrainingConfig,
        split: SplitModel,
        sources: list[dict[str, Any]],
        *,
        wait: float,
    ) -> bytes | None:
        """The combination of the states the last group's hospitals handed on: this
        hospital's own from its work directory, each other's opened from its seal."""
        deadline = time.monotonic() + wait
        blobs = []
        for source in sources:
            if source["hospital"] == self.me:
                blobs.append((self.jobs_dir(assignment.job) / "state.safetensors").read_bytes())
                continue
            etag = ""
            while source["ciphertext_sha256"] is None:  # the sender is still sealing
                if time.monotonic() > deadline or self.stopping.is_set():
                    _not_arrived(assignment, source["hospital"], waited=wait > 0)
                    return None
                # Long-polled: its record wakes this poll (no 1 s sleep between reads).
                fresh, etag = self._fresh_when_changed(assignment, etag, deadline)
                now = (fresh.raw.get("start_from") or {}).get("sources", []) if fresh else []
                match = [s for s in now if s["turn"] == source["turn"]]
                if not match:
                    return None
                source = match[0]
            blobs.append(self._open(assignment, source, deadline))
        return config.split_mode.combine_exported(blobs, lambda: client_parties(split, config))

    def _open(self, assignment: Assignment, source: dict[str, Any], deadline: float) -> bytes:
        """The state ``source``'s hospital sealed for this one (see :meth:`start_state`)."""
        key = self.job_keys.load(assignment.job)
        if key is None:
            raise SealError(
                f"this agent holds no per-job key for job {assignment.job} (deleted once the "
                "job ended, or this work directory is not the one that published it): the "
                f"weights {source['hospital']} sealed for this hospital cannot be opened"
            )
        return self.relay.take_handoff(
            keys=assignment.relay_keys,
            job=assignment.job_name,
            key=key,
            sender=source["hospital"],
            sender_identity=self._peer_identity(assignment, source["hospital"]),
            context=SealContext(
                job=assignment.job_name,
                round=source["round"],
                sender=source["hospital"],
                recipient=self.me,
            ),
            expected_sha256=source["ciphertext_sha256"],
            wait=max(0.0, deadline - time.monotonic()),
            stopping=self.stopping,
            topic=self._topic(assignment, source["round"]),
        )

    def hand_on(self, assignment: Assignment, turn: dict[str, Any], state: bytes) -> None:
        """Keep this state, and seal it for every other participant: to its published
        per-job key, once that key verifies under its pinned identity. A participant that
        has not published its key yet is waited for (up to ``reply_timeout``); one whose
        keys are refused gets nothing, and the others go on.

        Raises:
            PeerKeyRefused: some participant's keys were refused (after sealing for the rest).
        """
        write_private(self.jobs_dir(assignment.job) / "state.safetensors", state)
        mode = assignment.config().split_mode
        if mode.secure_aggregation:
            # Nobody gets this state in the clear: it goes into the round's secure
            # aggregation (submit_secure), masked.
            return
        if not mode.hands_on:
            return  # each party keeps its own segments (vertical): nobody else may see them
        pending = assignment.others(self.me)
        deadline = time.monotonic() + self.config.reply_timeout
        sealed, refused = 0, []
        etag = ""
        while pending:
            waiting, records = [], []
            for other in pending:
                if not other.get("recipient_key"):
                    waiting.append(other["hospital"])
                    continue
                try:
                    records.append(self._seal_for(assignment, turn, other, state))
                except (PeerKeyRefused, SealError) as e:
                    logger.error(
                        "job %s: not sealing for %s: %s", assignment.job, other["hospital"], e
                    )
                    refused.append(other["hospital"])
                if not sealed and records:
                    # The next hospital (first in ``others``) waits for its seal alone: it
                    # is recorded at once, the others' together once all are sealed.
                    sealed += self._record(assignment, turn, records)
                    records = []
            sealed += self._record(assignment, turn, records)
            if not waiting:
                break
            if time.monotonic() > deadline or self.stopping.is_set():
                logger.error(
                    "job %s: %s published no per-job key in time; no hand-off from this turn "
                    "is sealed for them",
                    assignment.job,
                    ", ".join(waiting),
                )
                break
            # Long-polled: a key's publication wakes this poll, where a 1 s sleep between
            # reads held a job's first hand-over when a peer published late.
            fresh, etag = self._fresh_when_changed(assignment, etag, deadline)
            if fresh is None:
                break
            pending = [p for p in fresh.others(self.me) if p["hospital"] in waiting]
        logger.info("job %s: weights sealed for %d other participant(s)", assignment.job, sealed)
        if refused:
            raise PeerKeyRefused(
                f"job {assignment.job}: refused the keys of {', '.join(refused)} (see above)"
            )

    def _seal_for(
        self, assignment: Assignment, turn: dict[str, Any], other: dict[str, Any], state: bytes
    ) -> dict[str, Any]:
        """Seal ``state`` for ``other`` and leave it on the relay; the record of it for
        the coordinator (recipient, hash, size)."""
        recipient = other["hospital"]
        identity = self.pins.identity(other)
        signed = SignedRecipientKey.from_json(
            job=assignment.job_name, hospital=recipient, data=other["recipient_key"]
        )
        digest, size = self.relay.put_handoff(
            keys=assignment.relay_keys,
            job=assignment.job_name,
            state=state,
            identity=self.identity,
            recipient=recipient,
            recipient_key=signed,
            recipient_identity=identity,
            context=SealContext(
                job=assignment.job_name, round=turn["round"], sender=self.me, recipient=recipient
            ),
            topic=self._topic(assignment, turn["round"]),
        )
        return {"recipient": recipient, "ciphertext_sha256": digest, "size_bytes": size}

    def _record(
        self, assignment: Assignment, turn: dict[str, Any], records: list[dict[str, Any]]
    ) -> int:
        """Tell the coordinator what was sealed (one request for them all); how many."""
        if records:
            self.coordinator.record_handoffs(job=assignment.job, turn=turn["id"], sealed=records)
        return len(records)

    def submit_secure(self, assignment: Assignment) -> str:
        """Take part in the assignment's open secure aggregation attempt with the state
        this hospital's last turn ended in (see :mod:`hospital_agent.secure_rounds`)."""
        config = assignment.config()
        split = hospital_split(assignment.model(), config.cuts, hospital_segments(config))
        state = (self.jobs_dir(assignment.job) / "state.safetensors").read_bytes()
        return self.secure.submit(
            job=assignment.job,
            job_name=assignment.job_name,
            keys=assignment.relay_keys,
            aggregation=assignment.raw["aggregation"],
            participants=assignment.raw["participants"],
            state=state,
            fresh=lambda: client_parties(split, config),
        )

    def _topic(self, assignment: Assignment, round_index: int) -> str:
        """The relay slot of the hand-offs of ``round_index`` (see
        :meth:`~medsplit.modes.SplitMode.handoff_topic`)."""
        mode = assignment.config().split_mode
        return mode.handoff_topic(round_index, len(assignment.raw["participants"]))

    def _fresh_when_changed(
        self, assignment: Assignment, etag: str, deadline: float
    ) -> tuple[Assignment | None, str]:
        """:meth:`_fresh`, long-polled: held until the assignments differ from ``etag``
        (the first call, with ``""``, answers at once), at most until ``deadline`` and
        ``HANDOFF_POLL_SECONDS`` (so that a stop is heard); and the answer's ETag."""
        wait = max(0.0, min(HANDOFF_POLL_SECONDS, deadline - time.monotonic())) if etag else 0.0
        asked = time.monotonic()
        fresh, answered = self.coordinator.assignments(wait=wait, etag=etag)
        if wait and answered == etag and time.monotonic() - asked < wait / 2:
            # Unchanged long before the wait ran out: the coordinator had no thread free to
            # hold the poll (as in the agent's poll loop). Ask again a little later.
            self.stopping.wait(min(1.0, wait))
        match = [a for a in fresh if a["job"] == assignment.job]
        return (Assignment(match[0]) if match else None), answered

    def keep_final(self, assignment: Assignment) -> Path | None:
        """Once the job completed: store the final weights (sealed for this hospital by
        whoever took the last turn) as ``final.safetensors``; ``None`` if not there yet."""
        path = self.jobs_dir(assignment.job) / "final.safetensors"
        if path.exists():
            return path
        config = assignment.config()
        state = self.start_state(assignment, config, None, wait=0.0, final=True)
        if state is None:
            return None
        write_private(path, state)
        logger.info("job %s completed: final weights saved to %s", assignment.job, path)
        return path


def _not_arrived(assignment: Assignment, sender: str, *, waited: bool) -> None:
    """A hand-off ``sender`` has not recorded: an error after a wait for it (a turn that
    cannot start); a plain "not yet" where the agent only looked (the final weights,
    looked for at each answer once the job completed, until the last turn's seal is in)."""
    if waited:
        logger.error("job %s: no hand-off from %s arrived", assignment.job, sender)
    else:
        logger.info(
            "job %s: the weights %s hands on are not recorded yet; taken once they are",
            assignment.job,
            sender,
        )
