"""Blobs one hospital leaves for another on the relay, sealed to the recipient's per-job
key and signed with the sender's identity: what the relay's owner sees is a size.

One :class:`SealedMail` per job serves everything hospitals send each other directly
apart from hand-offs: a vertical job's record alignment (``hospital_agent/alignment.py``)
and its label-leakage scores (``hospital_agent/leakage.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import Pins
from hospital_agent.relay import Relay
from medsplit.channel import RelayKeys
from medsplit.errors import MedSplitError
from medsplit.protocol.keys import SignedRecipientKey
from medsplit.protocol.sealing import SealContext, seal, unseal

#: How long a sealed blob waits on the relay for its recipient.
MAIL_TTL_SECONDS = 7 * 24 * 3600


class MailUnavailable(MedSplitError):
    """Nothing can be sealed for a participant, or opened from one, yet; the message
    says which and why."""


class SealedMail:
    """Sealed blobs between the participants of one job.

    Args:
        relay: this hospital's relay connection.
        keys: the deployment's relay key layout.
        job: the job's number; its name is ``job-N``.
        me: this hospital.
        participants: the job's participants as the assignment lists them (each with its
            ``hospital``, identity and published ``recipient_key``).
        identity: this hospital's identity key, which signs what it seals.
        pins: the participants' pinned identities.
        job_keys: this hospital's per-job keys, which open what was sealed for it.
    """

    def __init__(
        self,
        *,
        relay: Relay,
        keys: RelayKeys,
        job: int,
        me: str,
        participants: Sequence[Mapping[str, Any]],
        identity: MLDSA65PrivateKey,
        pins: Pins,
        job_keys: JobKeys,
    ) -> None:
        self.relay = relay
        self.keys = keys
        self.job = job
        self.job_name = f"job-{job}"
        self.me = me
        self.by_name = {p["hospital"]: p for p in participants}
        self.identity = identity
        self.pins = pins
        self.job_keys = job_keys

    def context(self, sender: str, recipient: str, purpose: str, round_: int = 0) -> SealContext:
        return SealContext(
            job=self.job_name, round=round_, sender=sender, recipient=recipient, purpose=purpose
        )

    def send(self, recipient: str, topic: str, purpose: str, data: bytes, round_: int = 0) -> None:
        """Seal ``data`` for ``recipient`` and leave it on the relay under ``topic``.

        Raises:
            MailUnavailable: the recipient has published no per-job key yet.
            PeerKeyRefused: its keys do not verify under its pinned identity.
            ChannelError: the relay refused or did not answer.
        """
        participant = self.by_name[recipient]
        if not participant.get("recipient_key"):
            raise MailUnavailable(
                f"job {self.job}: {recipient} has not published its per-job key yet; "
                "nothing can be sealed for it (it publishes one as soon as it sees the job)"
            )
        signed = SignedRecipientKey.from_json(
            job=self.job_name, hospital=recipient, data=participant["recipient_key"]
        )
        blob = seal(
            data,
            sender=self.identity,
            recipient=signed,
            recipient_identity=self.pins.identity(participant),
            context=self.context(self.me, recipient, purpose, round_),
        )
        self.relay.put_mail(
            keys=self.keys,
            job=self.job_name,
            recipient=recipient,
            topic=topic,
            blob=blob,
            ttl=MAIL_TTL_SECONDS,
        )

    def get(self, sender: str, topic: str) -> bytes | None:
        """The blob ``sender`` left for this hospital under ``topic``, if any (sealed)."""
        return self.relay.get_mail(keys=self.keys, job=self.job_name, sender=sender, topic=topic)

    def open(self, sender: str, purpose: str, blob: bytes, round_: int = 0) -> bytes:
        """What ``sender`` sealed for this hospital, once its seal and signature check.

        Raises:
            MailUnavailable: this agent holds no key for the job any more.
            SealError: the blob is not what ``sender`` sealed for this place.
            PeerKeyRefused: the sender's identity does not fit its pin.
        """
        key = self.job_keys.load(self.job)
        if key is None:
            raise MailUnavailable(
                f"job {self.job}: this agent holds no per-job key; it cannot open what "
                f"{sender} sealed for it"
            )
        return unseal(
            blob,
            recipient=key,
            sender=self.pins.identity(self.by_name[sender]),
            context=self.context(sender, self.me, purpose, round_),
        )
