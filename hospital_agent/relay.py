"""The relay as the agent uses it: its streams, and the sealed hand-offs it leaves for
the other participants and takes for itself (Redis ``SET``/``GET`` under its ACL user)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import redis
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey

from hospital_agent.identity import Credentials
from hospital_agent.outbox import Left, Outbox, counter_of, leave
from medsplit.channel import RelayKeys
from medsplit.channel.connect import RelayClient, connect
from medsplit.channel.redis import RedisChannel
from medsplit.errors import ChannelError, MedSplitError
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey
from medsplit.protocol.sealing import SealContext, seal, unseal

logger = logging.getLogger(__name__)

#: Sealed hand-offs expire after this long (participants fetch the final weights meanwhile).
HANDOFF_TTL_SECONDS = 7 * 24 * 3600


class HandoffMissing(MedSplitError):
    """The sealed weights to start from are not (yet) on the relay."""


class Relay:
    """This hospital's view of the relay, as its own Redis user."""

    def __init__(
        self, credentials: Credentials, *, timeout: float = 30.0, ca_bundle: str | None = None
    ) -> None:
        """``ca_bundle``: the CA file that checks a ``rediss://`` relay's certificate (the
        agent's ``ca_bundle``, which also checks the coordinator's); default: the system's."""
        self.credentials = credentials
        self.url = credentials.relay()
        self.timeout = timeout
        tls = self.url.startswith(("rediss://", "rediss+cluster://"))
        self._tls = {"ssl_ca_certs": ca_bundle} if tls and ca_bundle else {}
        #: The blobs this agent left, to put back where the relay lost them.
        self.outbox = Outbox(ttl=HANDOFF_TTL_SECONDS)

    def channel(self) -> RedisChannel:
        return RedisChannel(self.url, socket_timeout=self.timeout, **self._tls)

    def _client(self) -> RelayClient:
        return connect(
            self.url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            **self._tls,
        )

    def put_handoff(
        self,
        *,
        keys: RelayKeys,
        job: str,
        state: bytes,
        identity: MLDSA65PrivateKey,
        recipient: str,
        recipient_key: SignedRecipientKey,
        recipient_identity: MLDSA65PublicKey,
        context: SealContext,
        topic: str = "handoff",
    ) -> tuple[str, int]:
        """Seal ``state`` for ``recipient`` (to its published per-job key, which must be
        signed by its pinned ``recipient_identity``) and leave it on the relay, under
        ``keys``' mail key for ``job`` (the job's name, ``job-N``) about ``topic``.

        Returns:
            The SHA-256 and size of the blob (what the coordinator records).

        Raises:
            SealError: the recipient key is not signed by ``recipient_identity``.
        """
        blob = seal(
            state,
            sender=identity,
            recipient=recipient_key,
            recipient_identity=recipient_identity,
            context=context,
        )
        me = self.credentials.hospital
        left = Left(
            key=keys.mail(job, sender=me, recipient=recipient, topic=topic),
            blob=blob,
            counter=counter_of(keys.streams(job, me).up),
        )
        self._leave(left, recipient)
        self.outbox.left(job, left)
        return left.sha256, len(blob)

    def _leave(self, left: Left, recipient: str) -> None:
        """Write a blob and its mark, again while the relay is away (a restart takes
        seconds) for up to ``timeout`` seconds: the same bytes, so writing twice is safe."""
        deadline = time.monotonic() + self.timeout
        while True:
            client = self._client()
            try:
                leave(client, left, ttl=HANDOFF_TTL_SECONDS)
                return
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if time.monotonic() >= deadline:
                    raise ChannelError(
                        f"leaving the hand-off for {recipient} on the relay failed: {e}"
                    ) from e
                logger.warning("leaving the hand-off for %s: %s; again in 1 s", recipient, e)
            except redis.RedisError as e:
                raise ChannelError(
                    f"leaving the hand-off for {recipient} on the relay failed: {e}"
                ) from e
            finally:
                client.close()
            time.sleep(1.0)

    def put_mail(
        self, *, keys: RelayKeys, job: str, recipient: str, topic: str, blob: bytes, ttl: int
    ) -> None:
        """Leave ``blob`` for ``recipient`` under this hospital's mail key about ``topic``
        (replacing the last one), for ``ttl`` seconds.

        Raises:
            ChannelError: the relay refused or did not answer.
        """
        name = keys.mail(job, sender=self.credentials.hospital, recipient=recipient, topic=topic)
        client = self._client()
        try:
            client.set(name, blob, ex=ttl)
        except redis.RedisError as e:
            raise ChannelError(f"leaving {topic} for {recipient} on the relay failed: {e}") from e
        finally:
            client.close()

    def get_mail(self, *, keys: RelayKeys, job: str, sender: str, topic: str) -> bytes | None:
        """The blob ``sender`` left for this hospital about ``topic``, if there is one.

        Raises:
            ChannelError: the relay refused or did not answer.
        """
        name = keys.mail(job, sender=sender, recipient=self.credentials.hospital, topic=topic)
        client = self._client()
        try:
            return client.get(name)
        except redis.RedisError as e:
            raise ChannelError(f"fetching {topic} from {sender} failed: {e}") from e
        finally:
            client.close()

    def restore_handoffs(self, job: str) -> int:
        """Put back the blobs of ``job`` this agent left, where the relay lost them (see
        :mod:`hospital_agent.outbox`); how many were written again. A relay that does not
        answer is logged and left for the next look."""
        if not self.outbox.holds(job):
            return 0
        client = self._client()
        try:
            restored = self.outbox.restore(client, job)
        except redis.RedisError as e:
            logger.warning("%s: could not check the hand-offs left on the relay: %s", job, e)
            return 0
        finally:
            client.close()
        if restored:
            logger.warning(
                "%s: the relay had lost data (a restart?); put back the %d hand-off(s) this "
                "hospital left, unchanged",
                job,
                restored,
            )
        return restored

    def forget_handoffs(self, job: str) -> None:
        """``job`` ended: its blobs need no putting back any more."""
        self.outbox.forget(job)

    def take_handoff(
        self,
        *,
        keys: RelayKeys,
        job: str,
        key: RecipientKey,
        sender: str,
        sender_identity: MLDSA65PublicKey,
        context: SealContext,
        expected_sha256: str | None,
        wait: float,
        stopping: threading.Event,
        topic: str = "handoff",
    ) -> bytes:
        """Fetch the blob ``sender`` sealed for this hospital and open it with this
        agent's per-job ``key``, checking it is signed by ``sender``'s pinned identity;
        waits up to ``wait`` seconds for it to appear (the sender seals just after its turn
        ends).

        Raises:
            HandoffMissing: it did not appear in time.
            SealError: it is not what was sealed for this place (tampered, replayed, not
                signed by ``sender_identity``).
        """
        name = keys.mail(job, sender=sender, recipient=self.credentials.hospital, topic=topic)
        client = self._client()
        try:
            blob = None
            waited = 0.0
            while not stopping.is_set():
                blob = client.get(name)
                ready = blob is not None and (
                    expected_sha256 is None or hashlib.sha256(blob).hexdigest() == expected_sha256
                )
                if ready or waited >= wait:
                    break
                stopping.wait(0.5)
                waited += 0.5
        except redis.RedisError as e:
            raise ChannelError(f"fetching the hand-off from {sender} failed: {e}") from e
        finally:
            client.close()
        if blob is None:
            raise HandoffMissing(
                f"the weights {sender} sealed for this hospital are not on the relay "
                f"(key {name}); they expire after {HANDOFF_TTL_SECONDS // 86400} days"
            )
        if expected_sha256 is not None and hashlib.sha256(blob).hexdigest() != expected_sha256:
            raise HandoffMissing(
                f"the blob from {sender} on the relay is not the one the coordinator recorded "
                "(a newer or an altered one): refusing it"
            )
        return unseal(blob, recipient=key, sender=sender_identity, context=context)
