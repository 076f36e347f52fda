"""The agent reaches a ``rediss://`` relay whose certificate its ``ca_bundle`` vouches
for, both for the turn's streams and for sealed hand-offs, and refuses one it does not."""

from __future__ import annotations

import threading
import uuid

import pytest

from hospital_agent.identity import Credentials
from hospital_agent.relay import Relay
from medsplit.errors import ChannelError
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, generate_identity_key
from medsplit.protocol.sealing import SealContext
from tests.medsplit.test_redis_tls import tls_redis
from tests.redis_server import session_keys

__all__ = ["tls_redis"]


def _relay(url: str, slug: str, ca_bundle: str | None) -> Relay:
    host = url.split("://", 1)[1]
    # The TLS test server has only its default user, without a password.
    credentials = Credentials(slug, "t", f"rediss://{host}", "default", "")
    return Relay(credentials, timeout=5, ca_bundle=ca_bundle)


def test_hand_offs_and_frames_cross_a_tls_relay_checked_with_the_agents_ca(tls_redis) -> None:
    url, ca = tls_redis
    a, b = _relay(url, "a", str(ca)), _relay(url, "b", str(ca))
    a_identity, b_identity, b_key = (
        generate_identity_key(),
        generate_identity_key(),
        RecipientKey.generate(),
    )
    job = f"test-{uuid.uuid4().hex[:6]}"
    context = SealContext(job=job, round=0, sender="a", recipient="b")
    published = SignedRecipientKey.sign(
        job=job, hospital="b", key=b_key.public(), identity=b_identity
    )
    digest, _ = a.put_handoff(
        keys=session_keys(), job=job, state=b"weights", identity=a_identity, recipient="b",
        recipient_key=published, recipient_identity=b_identity.public_key(), context=context,
    )  # fmt: skip
    taken = b.take_handoff(
        keys=session_keys(), job=job, key=b_key, sender="a",
        sender_identity=a_identity.public_key(),
        context=context, expected_sha256=digest, wait=1, stopping=threading.Event(),
    )  # fmt: skip
    assert taken == b"weights"
    sender, receiver = a.channel(), b.channel()
    try:
        sender.send("medsplit:tls:a:up", b"frame")
        assert receiver.receive("medsplit:tls:a:up", timeout=5) == b"frame"
    finally:
        sender.close()
        receiver.close()


def test_a_relay_the_agent_cannot_vouch_for_is_refused(tls_redis) -> None:
    url, _ = tls_redis
    relay = _relay(url, "a", None)  # the system's CAs do not know the test's certificate
    b_identity = generate_identity_key()
    published = SignedRecipientKey.sign(
        job="1", hospital="b", key=RecipientKey.generate().public(), identity=b_identity
    )
    with pytest.raises(ChannelError, match="hand-off"):
        relay.put_handoff(
            keys=session_keys(), job="job-1", state=b"w", identity=generate_identity_key(),
            recipient="b", recipient_key=published, recipient_identity=b_identity.public_key(),
            context=SealContext(job="1", round=0, sender="a", recipient="b"),
        )  # fmt: skip
