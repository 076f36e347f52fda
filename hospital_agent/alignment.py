"""Record alignment of a vertical job over the relay, before its first turn.

The label party (the job's first participant) runs one private set intersection
(:mod:`medsplit.psi`) as the client with each other party, as the server; it meets the
pairwise results into the K-way intersection, in the seed's common order, and hands that
on to every other party. Every message is sealed (HPKE to the recipient's per-job key,
signed with the sender's identity, :mod:`medsplit.protocol.sealing`) and left as relay
mail, so the relay's owner sees sizes only::

    label party L                                    each other party P
    psi     L -> P   sealed "psi-request": PSI request (L's blinded identifiers)
    psi     P -> L   sealed "psi-reply": SHA-256 of the request it answers, setup, response
    alignment L -> P sealed "alignment": the K-way intersection (Alignment.to_bytes)

Then every party reports the digest and size of the intersection it holds to the
coordinator (``POST /api/agent/assignments/{job}/alignment/``) and waits until all have
and the digests agree; a mismatch, or an intersection below the job's minimum, fails the
job there, and here raises before any training.

The result is kept in the job's folder (``alignment.bin``, 0600) and reused by a later
turn or a restarted agent after it is checked again (format, order, minimum, every
identifier among this party's records, the coordinator's agreement).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent.data.vertical import VerticalRecords
from hospital_agent.identity import write_private
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import Pins
from hospital_agent.relay import Relay
from hospital_agent.sealed_mail import MailUnavailable, SealedMail
from medsplit.channel import RelayKeys
from medsplit.errors import MedSplitError
from medsplit.psi import Alignment, PsiClient, PsiServer
from medsplit.psi.alignment import common_order
from medsplit.psi.errors import DigestMismatch, IntersectionTooSmall, PsiError, PsiMessageError
from medsplit.psi.session import ServerReply

logger = logging.getLogger(__name__)

__all__ = [
    "ALIGNMENT_FILE",
    "ALIGNMENT_TOPIC",
    "PSI_TOPIC",
    "TRAINING",
    "AlignedRecords",
    "AlignmentFailed",
    "AlignmentStage",
    "FrameAgreement",
    "align_records",
    "pack_reply",
    "prediction_stage",
    "test_stage",
    "unpack_reply",
]

#: The relay topic of the PSI request (label party to another) and its reply (back).
PSI_TOPIC = "psi"
#: The relay topic of the K-way intersection handed on by the label party.
ALIGNMENT_TOPIC = "alignment"
#: The kept alignment in the job's folder.
ALIGNMENT_FILE = "alignment.bin"
REPLY_MAGIC = b"MSPSIREPLY1"
#: The most PSI requests a party answers in one alignment: a restarted label party sends
#: a fresh one, but each answer tells the intersection with whatever set it was made of.
MAX_ANSWERS = 3
_POLL_SECONDS = 0.2
_STATE_EVERY_SECONDS = 1.0


class AlignmentFailed(MedSplitError):
    """The parties could not align their records (the message says who and why); the
    job does not train."""


@dataclass(frozen=True)
class AlignmentStage:
    """Which records an alignment is of: its relay topics, its file in the job's folder
    and the PSI sessions' tag. Training's records (:data:`TRAINING`), or the test records
    of one evaluation (:func:`test_stage`)."""

    psi_topic: str = PSI_TOPIC
    alignment_topic: str = ALIGNMENT_TOPIC
    file: str = ALIGNMENT_FILE
    session: str = "psi"


TRAINING = AlignmentStage()


def test_stage(round_: int) -> AlignmentStage:
    """The test records' alignment of the evaluation whose frames carry ``round_``: its
    own topics, file and sessions, so it never mixes with training's."""
    return AlignmentStage("psi-test", "alignment-test", f"test-alignment-{round_}.bin",
                          f"psi-test-{round_}")  # fmt: skip


def prediction_stage(round_: int) -> AlignmentStage:
    """The alignment of the vertical prediction whose frames carry ``round_``: the label
    party's requested records with every other party's, on topics of its own."""
    return AlignmentStage("psi-predict", "alignment-predict", f"predict-alignment-{round_}.bin",
                          f"psi-predict-{round_}")  # fmt: skip


class FrameAgreement:
    """The agreement of a test alignment: not at the coordinator (which keeps training's),
    but at the worker, which refuses a test batch whose frames do not carry the same
    intersection's size and digest from every party (:mod:`medsplit.turns.vertical_eval`)."""

    def report_alignment(self, *, job: int, digest: str, size: int) -> dict[str, Any]:
        return {"status": "agreed", "size": size}

    def alignment(self, *, job: int) -> dict[str, Any]:
        return {"status": "pending"}


class AlignmentCoordinator(Protocol):
    """What this module asks of the coordinator (:class:`~hospital_agent.coordinator.Coordinator`
    has both)."""

    def report_alignment(self, *, job: int, digest: str, size: int) -> dict[str, Any]: ...

    def alignment(self, *, job: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class AlignedRecords:
    """This party's records in the alignment's order.

    Attributes:
        alignment: the K-way intersection, in the seed's common order.
        features: one row per aligned identifier, in that order.
        labels: at the label party, its labels in that order; elsewhere ``None``.
    """

    alignment: Alignment
    features: torch.Tensor
    labels: torch.Tensor | None


def pack_reply(request: bytes, reply: ServerReply) -> bytes:
    """A server's reply as one message: magic, SHA-256 of the request it answers, setup
    length (4 bytes), setup, response."""
    digest = hashlib.sha256(request).digest()
    return REPLY_MAGIC + digest + struct.pack(">I", len(reply.setup)) + reply.setup + reply.response


def unpack_reply(data: bytes) -> tuple[bytes, ServerReply]:
    """The request digest and the reply in ``data``.

    Raises:
        PsiMessageError: not a reply of this layout.
    """
    head = len(REPLY_MAGIC) + 32 + 4
    if not isinstance(data, bytes) or not data.startswith(REPLY_MAGIC) or len(data) < head:
        raise PsiMessageError("not a PSI reply (wrong magic, or truncated)")
    answers = data[len(REPLY_MAGIC) : len(REPLY_MAGIC) + 32]
    (length,) = struct.unpack_from(">I", data, head - 4)
    if length < 1 or head + length >= len(data):
        raise PsiMessageError("PSI reply: its setup length does not fit the message")
    return answers, ServerReply(data[head : head + length], data[head + length :])


def align_records(
    *,
    relay: Relay,
    keys: RelayKeys,
    coordinator: AlignmentCoordinator,
    job: int,
    me: str,
    participants: Sequence[Mapping[str, Any]],
    records: VerticalRecords,
    seed: int,
    minimum: int,
    identity: MLDSA65PrivateKey,
    pins: Pins,
    job_keys: JobKeys,
    folder: Path,
    timeout: float,
    stopping: threading.Event | None = None,
    stage: AlignmentStage = TRAINING,
) -> AlignedRecords:
    """Align this party's ``records`` with the other participants' (see the module
    docstring), or reuse the alignment kept in ``folder``.

    Args:
        relay, keys: this hospital's view of the relay and the deployment's key layout.
        coordinator: where the digests are compared.
        job: the job's id (its relay name is ``job-<id>``).
        me: this hospital's slug.
        participants: the assignment's participants, in the job's order (the first is
            the label party), with their identity and per-job keys.
        records: this party's records (:func:`hospital_agent.data.load_vertical`).
        seed: the job's seed (the common order).
        minimum: the smallest intersection the job trains on.
        identity, pins, job_keys: this agent's identity key, its pins of the others',
            its per-job keys (the job's must exist: published before the first turn).
        folder: the job's work folder (the alignment is kept there).
        timeout: how long to wait for each stage (the others' messages, the agreement).
        stopping: set when the agent stops.
        stage: training's records, or an evaluation's test records (:func:`test_stage`).

    Raises:
        IntersectionTooSmall: below ``minimum`` (the coordinator fails the job).
        DigestMismatch: the parties hold different intersections (the job failed).
        PsiMessageError: a party's message is malformed (a hostile or broken party).
        SealError: a message is not sealed by the party it should come from, for here.
        AlignmentFailed: a message did not come in time, a key is missing, the kept
            alignment no longer fits the records, or the coordinator failed the job.
    """
    side = _Side(
        relay=relay,
        keys=keys,
        coordinator=coordinator,
        job=job,
        me=me,
        participants=list(participants),
        records=records,
        seed=seed,
        minimum=minimum,
        identity=identity,
        pins=pins,
        job_keys=job_keys,
        folder=folder,
        timeout=timeout,
        stopping=stopping or threading.Event(),
        stage=stage,
    )
    return side.run()


@dataclass
class _Side:
    """One party's part (the arguments of :func:`align_records`)."""

    relay: Relay
    keys: RelayKeys
    coordinator: AlignmentCoordinator
    job: int
    me: str
    participants: list[Mapping[str, Any]]
    records: VerticalRecords
    seed: int
    minimum: int
    identity: MLDSA65PrivateKey
    pins: Pins
    job_keys: JobKeys
    folder: Path
    timeout: float
    stopping: threading.Event
    stage: AlignmentStage = TRAINING

    def __post_init__(self) -> None:
        self.job_name = f"job-{self.job}"
        names = [str(p["hospital"]) for p in self.participants]
        if self.me not in names or len(names) < 2 or len(set(names)) != len(names):
            raise AlignmentFailed(
                f"job {self.job}: a vertical job needs two or more distinct parties, this "
                f"hospital among them; got {names}"
            )
        self.label = names[0]
        self.by_name = {str(p["hospital"]): p for p in self.participants}
        self.path = self.folder / self.stage.file
        self.mail = SealedMail(
            relay=self.relay,
            keys=self.keys,
            job=self.job,
            me=self.me,
            participants=self.participants,
            identity=self.identity,
            pins=self.pins,
            job_keys=self.job_keys,
        )

    # -- the whole run ------------------------------------------------------------------

    def run(self) -> AlignedRecords:
        alignment = self._kept()
        if alignment is None and self.me == self.label:
            alignment = self._label_side()
        elif alignment is None:
            alignment = self._other_side()
            self._positions(alignment)  # checked before it is kept
            self._keep(alignment)
        elif self.me == self.label:
            self._hand_on(alignment)  # again: a party may have missed it before a restart
        positions = self._positions(alignment)
        self._agree(alignment)
        rows = self.records.rows(positions)
        labels = rows.labels if self.me == self.label else None
        logger.info(
            "job %s: %d records aligned with %d other parties",
            self.job,
            len(alignment),
            len(self.participants) - 1,
        )
        return AlignedRecords(alignment, rows.features, labels)

    def _kept(self) -> Alignment | None:
        if not self.path.exists():
            return None
        try:
            alignment = Alignment.from_bytes(
                self.path.read_bytes(), seed=self.seed, minimum=self.minimum
            )
            self._positions(alignment)
        except (OSError, PsiError, AlignmentFailed) as e:
            raise AlignmentFailed(
                f"job {self.job}: the alignment kept in {self.path} no longer fits ({e}); "
                "the records must not change during a job"
            ) from e
        return alignment

    def _keep(self, alignment: Alignment) -> None:
        """Kept as privately as the per-job key: the identifiers are pseudonyms, still."""
        write_private(self.path, alignment.to_bytes())

    def _positions(self, alignment: Alignment) -> list[int]:
        """Each aligned identifier's row here; the error counts the missing ones and names
        none (it may reach the coordinator as the turn's failure)."""
        own = set(self.records.identifiers)
        missing = sum(1 for i in alignment.identifiers if i not in own)
        if missing:
            raise AlignmentFailed(
                f"job {self.job}: {missing:,} of the {len(alignment):,} aligned identifiers "
                f"are not in {self.me}'s records: the intersection was not computed on them"
            )
        return alignment.positions(self.records.identifiers, source=f"{self.me}'s records")

    # -- the label party ----------------------------------------------------------------

    def _label_side(self) -> Alignment:
        others = [name for name in self.by_name if name != self.label]
        clients: dict[str, PsiClient] = {}
        requests: dict[str, bytes] = {}
        for name in others:
            client = PsiClient(self.records.identifiers, session=self._session(name))
            clients[name] = client
            requests[name] = client.request()
            self._send(name, self.stage.psi_topic, "psi-request", requests[name])
        pairwise: dict[str, tuple[str, ...]] = {}

        def take(name: str, data: bytes) -> bool:
            answers, reply = unpack_reply(data)
            if answers != hashlib.sha256(requests[name]).digest():
                return False  # a reply to an earlier request (before a restart): wait
            try:
                pairwise[name] = clients[name].intersect(reply)
            except PsiMessageError as e:
                raise PsiMessageError(f"the PSI reply of {name}: {e}") from e
            return True

        self._collect(others, self.stage.psi_topic, "psi-reply", take, what="PSI replies")
        shared = set(self.records.identifiers)
        for name in others:
            shared &= set(pairwise[name])
        alignment = Alignment(common_order(tuple(shared), seed=self.seed), self.seed)
        if len(alignment) < self.minimum:
            # Reported (the size only) so that the coordinator fails the job for all;
            # the too-small intersection itself is handed to nobody.
            self.coordinator.report_alignment(
                job=self.job, digest=alignment.digest(), size=len(alignment)
            )
            raise IntersectionTooSmall(
                f"job {self.job}: the parties share {len(alignment):,} records, below the "
                f"job's minimum of {self.minimum:,}; the job does not start",
                size=len(alignment),
                minimum=self.minimum,
            )
        # Kept before it leaves: a restart after this reuses it rather than asking the
        # others, who may have gone on already, for a new PSI run.
        self._keep(alignment)
        self._hand_on(alignment)
        return alignment

    def _hand_on(self, alignment: Alignment) -> None:
        for name in self.by_name:
            if name != self.label:
                self._send(name, self.stage.alignment_topic, "alignment", alignment.to_bytes())

    # -- another party ------------------------------------------------------------------

    def _other_side(self) -> Alignment:
        answered: bytes | None = None
        answers = 0
        deadline = time.monotonic() + self.timeout
        next_state = 0.0
        while True:
            blob = self._mail(self.label, self.stage.alignment_topic)
            if blob is not None:
                data = self._open(self.label, "alignment", blob)
                try:
                    return Alignment.from_bytes(data, seed=self.seed, minimum=self.minimum)
                except PsiMessageError as e:
                    raise PsiMessageError(f"the intersection {self.label} handed on: {e}") from e
            request = self._mail(self.label, self.stage.psi_topic)
            if request is not None and hashlib.sha256(request).digest() != answered:
                # A new request (the first, or the label party's after a restart).
                if answers >= MAX_ANSWERS:
                    raise AlignmentFailed(
                        f"job {self.job}: {self.label} sent more than {MAX_ANSWERS} PSI "
                        "requests; each answer would tell it the intersection with another "
                        "set, so no more are answered"
                    )
                answers += 1
                plain = self._open(self.label, "psi-request", request)
                server = PsiServer(self.records.identifiers, session=self._session(self.me))
                try:
                    reply = server.answer(plain)
                except PsiMessageError as e:
                    raise PsiMessageError(f"the PSI request of {self.label}: {e}") from e
                self._send(self.label, self.stage.psi_topic, "psi-reply", pack_reply(plain, reply))
                answered = hashlib.sha256(request).digest()
            if time.monotonic() >= next_state:
                self._check_state(self.coordinator.alignment(job=self.job))
                next_state = time.monotonic() + _STATE_EVERY_SECONDS
            self._wait(deadline, f"the intersection from {self.label}")

    # -- the digest check ---------------------------------------------------------------

    def _agree(self, alignment: Alignment) -> None:
        state = self.coordinator.report_alignment(
            job=self.job, digest=alignment.digest(), size=len(alignment)
        )
        deadline = time.monotonic() + self.timeout
        while not self._check_state(state):
            self._wait(deadline, "every party's digest at the coordinator", every=0.5)
            state = self.coordinator.alignment(job=self.job)

    def _check_state(self, state: Mapping[str, Any]) -> bool:
        """``True`` once the coordinator says the parties agree; raises if it failed."""
        status = state.get("status")
        reason = str(state.get("reason") or "")
        if status == "agreed":
            return True
        if status == "mismatch":
            why = reason or "the parties hold different intersections"
            raise DigestMismatch(f"job {self.job}: {why}")
        if status == "too_small":
            raise IntersectionTooSmall(
                f"job {self.job}: {reason}",
                size=int(state.get("size") or 0),
                minimum=int(state.get("minimum") or self.minimum),
            )
        if status == "failed":
            raise AlignmentFailed(f"job {self.job}: {reason or 'the job ended'}")
        return False

    # -- mail ---------------------------------------------------------------------------

    def _session(self, other: str) -> str:
        """The PSI session of the label party and ``other``: from the schedule only."""
        return f"{self.job_name}/{self.stage.session}/{self.label}/{other}"

    def _send(self, recipient: str, topic: str, purpose: str, data: bytes) -> None:
        try:
            self.mail.send(recipient, topic, purpose, data)
        except MailUnavailable as e:
            raise AlignmentFailed(str(e)) from e

    def _mail(self, sender: str, topic: str) -> bytes | None:
        return self.mail.get(sender, topic)

    def _open(self, sender: str, purpose: str, blob: bytes) -> bytes:
        try:
            return self.mail.open(sender, purpose, blob)
        except MailUnavailable as e:
            raise AlignmentFailed(str(e)) from e

    def _collect(
        self,
        senders: list[str],
        topic: str,
        purpose: str,
        take: Callable[[str, bytes], bool],
        *,
        what: str,
    ) -> None:
        """Open each sender's mail on ``topic`` until ``take`` accepts one of each."""
        waiting = list(senders)
        deadline = time.monotonic() + self.timeout
        next_state = 0.0
        while waiting:
            for name in list(waiting):
                blob = self._mail(name, topic)
                if blob is not None and take(name, self._open(name, purpose, blob)):
                    waiting.remove(name)
            if not waiting:
                return
            if time.monotonic() >= next_state:
                self._check_state(self.coordinator.alignment(job=self.job))
                next_state = time.monotonic() + _STATE_EVERY_SECONDS
            self._wait(deadline, f"{what} from {', '.join(waiting)}")

    def _wait(self, deadline: float, what: str, every: float = _POLL_SECONDS) -> None:
        if time.monotonic() >= deadline:
            raise AlignmentFailed(
                f"job {self.job}: no {what} within {self.timeout:.0f} s; the job does not "
                "train until its parties are aligned"
            )
        if self.stopping.wait(every):
            raise AlignmentFailed(f"job {self.job}: the agent is stopping")
