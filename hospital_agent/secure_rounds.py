"""This hospital's part in secure aggregation rounds (SplitFed): mask its segments, submit
them through the relay, and unmask the aggregate into the state the next round starts from.

For one round attempt (the assignment's ``aggregation``):

1. draw its secrets (:class:`medsplit.secagg.HospitalRound`) and keep them in the job's
   folder, as privately as its per-job key, before any leaves (a restarted agent masks
   with the seeds the others already hold);
2. seal them for the other participants, to the per-job keys their pinned identities
   signed, and leave one envelope per recipient on the relay (mail topic ``mask-seed``);
3. open the envelopes the others left for it;
4. mask its float32 weights (front, and head in U-shaped) in the ring, put the masked
   vector on its ``agg`` stream, and report its digest, size and integer buffers;
5. once the coordinator says the attempt is done, read the aggregate off its stream (the
   one whose digest it recorded), remove the group mask, divide by the total weight, and
   keep the average as ``average-round-<r>.safetensors``; the secrets are then deleted.

No other hospital, worker or the coordinator ever sees this hospital's weights, single or
averaged: only masked vectors and the aggregate, still under the group mask, cross.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent.coordinator import Coordinator
from hospital_agent.identity import read_private, write_private
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import Pins
from hospital_agent.relay import Relay
from medsplit.channel import RelayKeys
from medsplit.errors import ChannelTimeout, MedSplitError
from medsplit.protocol.handoff import import_parties
from medsplit.protocol.keys import SignedRecipientKey
from medsplit.protocol.party import Party
from medsplit.secagg import Aggregate, HospitalRound, Peer, RoundId, VectorLayout
from medsplit.secagg.envelope import StaleEnvelope, open_envelope, pack
from medsplit.training.aggregate_state import (
    aggregation_parts,
    averaged_export,
    counts_from_json,
    counts_to_json,
)

logger = logging.getLogger(__name__)

#: The relay topic of the envelopes of sealed seeds.
SEED_TOPIC = "mask-seed"
#: How long an envelope stays on the relay (a round's deadline is at most a week).
SEED_TTL_SECONDS = 7 * 24 * 3600


class SecureRoundError(MedSplitError):
    """This hospital cannot take its part in a secure aggregation round (the message says
    which round and why)."""


class SecureRounds:
    """This agent's secure aggregation rounds (see the module docstring).

    Args:
        me: this hospital's slug.
        identity: its identity key (signs its sealed seeds).
        relay: its view of the relay.
        coordinator: the coordinator's client.
        pins: the other participants' pinned identities.
        job_keys: its per-job recipient keys (open the seeds sealed for it).
        folder: the job's work folder, by job id.
        stopping: set when the agent stops.
        wait: how long to wait for the others' envelopes and the aggregate, in seconds.
    """

    def __init__(
        self,
        *,
        me: str,
        identity: MLDSA65PrivateKey,
        relay: Relay,
        coordinator: Coordinator,
        pins: Pins,
        job_keys: JobKeys,
        folder: Callable[[int], Path],
        stopping: threading.Event,
        wait: float,
    ) -> None:
        self.me = me
        self.identity = identity
        self.relay = relay
        self.coordinator = coordinator
        self.pins = pins
        self.job_keys = job_keys
        self.folder = folder
        self.stopping = stopping
        self.wait = wait

    # -- paths ------------------------------------------------------------------------

    def _secrets_path(self, job: int, aggregation: Mapping[str, Any]) -> Path:
        name = f"secagg-round-{aggregation['round']}-attempt-{aggregation['attempt']}.json"
        return self.folder(job) / name

    def average_path(self, job: int, round_index: int) -> Path:
        """Where the unmasked average of ``round_index`` is kept."""
        return self.folder(job) / f"average-round-{round_index}.safetensors"

    # -- the round --------------------------------------------------------------------

    def round_id(self, job_name: str, aggregation: Mapping[str, Any]) -> RoundId:
        return RoundId(
            job_name,
            int(aggregation["round"]),
            int(aggregation["attempt"]),
            {str(h): int(w) for h, w in aggregation["weights"].items()},
        )

    def _side(
        self,
        *,
        job: int,
        job_name: str,
        aggregation: Mapping[str, Any],
        participants: list[dict[str, Any]],
        layout: VectorLayout,
    ) -> HospitalRound:
        """This hospital's side of the attempt, with its kept secrets if it has them."""
        rid = self.round_id(job_name, aggregation)
        key = self.job_keys.load(job)
        if key is None:
            raise SecureRoundError(
                f"job {job}: this agent holds no per-job key (deleted, or another work "
                "directory published it): it cannot open the seeds sealed for it"
            )
        peers = {}
        for p in participants:
            name = p["hospital"]
            if name == self.me or name not in rid.weights:
                continue
            if not p.get("recipient_key"):
                raise SecureRoundError(
                    f"job {job}: {name} has not published its per-job key yet; no seed can be "
                    "sealed for it"
                )
            peers[name] = Peer(
                self.pins.identity(p),
                SignedRecipientKey.from_json(job=job_name, hospital=name, data=p["recipient_key"]),
            )
        side = HospitalRound(
            rid, self.me, identity=self.identity, recipient_key=key, peers=peers, layout=layout
        )
        path = self._secrets_path(job, aggregation)
        if path.exists():
            side.restore(json.loads(read_private(path)))
        else:  # kept before anything leaves: a restart must mask with the same seeds
            self._keep(job, aggregation, side)
        return side

    def _keep(self, job: int, aggregation: Mapping[str, Any], side: HospitalRound) -> None:
        """Keep ``side``'s secrets, drawn and received, as privately as the per-job key."""
        write_private(self._secrets_path(job, aggregation), json.dumps(side.saved()).encode())

    def submit(
        self,
        *,
        job: int,
        job_name: str,
        keys: RelayKeys,
        aggregation: Mapping[str, Any],
        participants: list[dict[str, Any]],
        state: bytes,
        fresh: Callable[[], Mapping[str, Party]],
    ) -> str:
        """Take part in ``aggregation`` with ``state`` (this hospital's exported parties
        after its turn): exchange seeds, mask, submit, report. Returns the digest.

        Raises:
            SecureRoundError: the others' seeds did not come in time, or a key is missing.
            SecAggError: a seed does not open (tampered, another attempt), or the state
                does not fit the ring.
        """
        parties = fresh()
        import_parties(state, parties)
        floats, counts = aggregation_parts(parties)
        side = self._side(
            job=job,
            job_name=job_name,
            aggregation=aggregation,
            participants=participants,
            layout=VectorLayout.of(floats),
        )
        rid = side.round_id
        by_recipient: dict[str, list] = {}
        for secret in side.outgoing():
            by_recipient.setdefault(secret.recipient, []).append(secret)
        for recipient, secrets in by_recipient.items():
            self.relay.put_mail(
                keys=keys,
                job=job_name,
                recipient=recipient,
                topic=SEED_TOPIC,
                blob=pack(rid, secrets),
                ttl=SEED_TTL_SECONDS,
            )
        self._accept_all(side, keys=keys, job_name=job_name)
        # With what it received (the group key): what unmasking the aggregate needs.
        self._keep(job, aggregation, side)
        data = side.mask(floats).to_bytes()
        channel = self.relay.channel()
        try:
            channel.send(keys.streams(job_name, self.me, "agg").up, data)
        finally:
            channel.close()
        digest = hashlib.sha256(data).hexdigest()
        self.coordinator.record_submission(
            job=job,
            round_index=rid.round,
            attempt=rid.attempt,
            sha256=digest,
            size_bytes=len(data),
            counts=counts_to_json(counts),
        )
        logger.info(
            "job %s round %s attempt %s: masked submission sent (%d bytes, sha256 %s...)",
            job,
            rid.round,
            rid.attempt,
            len(data),
            digest[:16],
        )
        return digest

    def _accept_all(self, side: HospitalRound, *, keys: RelayKeys, job_name: str) -> None:
        deadline = time.monotonic() + self.wait
        while side.expected:
            for sender in sorted({s for _, s in side.expected}):
                blob = self.relay.get_mail(keys=keys, job=job_name, sender=sender, topic=SEED_TOPIC)
                if blob is None:
                    continue
                try:
                    secrets = open_envelope(
                        blob, round_id=side.round_id, sender=sender, recipient=self.me
                    )
                except StaleEnvelope:
                    continue  # the last attempt's, still there: the new one is coming
                for secret in secrets:
                    if (secret.kind, secret.sender) in side.expected:
                        side.accept(secret)
            if not side.expected:
                return
            if time.monotonic() > deadline or self.stopping.wait(0.5):
                raise SecureRoundError(
                    f"round {side.round_id.round} attempt {side.round_id.attempt}: no seeds "
                    f"from {sorted({s for _, s in side.expected})} within {self.wait:.0f} s"
                )

    def average(
        self,
        *,
        job: int,
        job_name: str,
        keys: RelayKeys,
        aggregation: Mapping[str, Any],
        participants: list[dict[str, Any]],
        fresh: Callable[[], Mapping[str, Party]],
    ) -> bytes:
        """The state the next round starts from: the unmasked weighted average of the done
        ``aggregation`` (kept once made), with the participants' integer buffers combined.

        Raises:
            SecureRoundError: the aggregate is not on the relay in time, or this agent no
                longer holds the round's secrets.
            SecAggError: the aggregate is not of this attempt, or another hospital's
                integer buffers do not fit the model.
        """
        path = self.average_path(job, int(aggregation["round"]))
        if path.exists():
            return path.read_bytes()
        if not self._secrets_path(job, aggregation).exists():
            raise SecureRoundError(
                f"job {job} round {aggregation['round']} attempt {aggregation['attempt']}: "
                "this agent holds no secrets of it (another work directory took part?); "
                "it cannot remove the group mask"
            )
        parties = fresh()
        floats, own_counts = aggregation_parts(parties)
        side = self._side(
            job=job,
            job_name=job_name,
            aggregation=aggregation,
            participants=participants,
            layout=VectorLayout.of(floats),
        )
        data = self._aggregate_bytes(keys, job_name, aggregation["aggregate_sha256"])
        average = side.unmask(Aggregate.from_bytes(data))
        reported = aggregation.get("counts") or {}
        counts = [
            counts_from_json(reported.get(h), own_counts, of=h) for h in side.round_id.participants
        ]
        state = averaged_export(fresh(), average, counts)
        write_private(path, state)
        self._secrets_path(job, aggregation).unlink(missing_ok=True)
        logger.info(
            "job %s round %s: the average of %d hospitals unmasked and kept",
            job,
            aggregation["round"],
            len(side.round_id.participants),
        )
        return state

    def _aggregate_bytes(self, keys: RelayKeys, job_name: str, sha256: str) -> bytes:
        stream = keys.streams(job_name, self.me, "agg").down
        deadline = time.monotonic() + self.wait
        channel = self.relay.channel()
        try:
            while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
                try:
                    data = channel.receive(stream, timeout=min(left, 5.0))
                except ChannelTimeout:
                    continue
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data
                logger.info("%s: skipping an aggregate of an earlier attempt", stream)
        finally:
            channel.close()
        raise SecureRoundError(
            f"the aggregate (sha256 {sha256[:16]}...) is not on this hospital's stream "
            f"{stream} within {self.wait:.0f} s"
        )


__all__ = ["SEED_TOPIC", "SecureRoundError", "SecureRounds"]
