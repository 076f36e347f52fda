"""The hand-offs an agent left, put back where the relay lost them (a restart keeps no
data): the same bytes, so the hash the coordinator recorded still opens them."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from hospital_agent.identity import Credentials
from hospital_agent.relay import Relay
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, generate_identity_key
from medsplit.protocol.sealing import SealContext
from tests.redis_server import session_keys


@pytest.fixture
def job() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw(redis_url: str, job: str) -> Iterator[redis.Redis]:
    if not redis_url.startswith("redis://"):
        pytest.skip("these hand-off tests use a Redis reached over TCP")
    client = redis.Redis.from_url(redis_url)
    yield client
    lose_everything(client, job)
    client.close()


class Party:
    """A hospital with its identity, its per-job key and its view of the relay."""

    def __init__(self, redis_url: str, slug: str, job: str) -> None:
        host = redis_url.split("://", 1)[1]
        self.slug = slug
        self.relay = Relay(Credentials(slug, "t", f"redis://{host}", "default", "unused"))
        self.identity = generate_identity_key()
        self.key = RecipientKey.generate()
        self.published = SignedRecipientKey.sign(
            job=job, hospital=slug, key=self.key.public(), identity=self.identity
        )


def hand_on(
    sender: Party, recipient: Party, job: str, state: bytes, topic: str = "handoff", round_: int = 0
) -> str:
    digest, _ = sender.relay.put_handoff(
        keys=session_keys(), job=job, state=state, identity=sender.identity,
        recipient=recipient.slug, recipient_key=recipient.published,
        recipient_identity=recipient.identity.public_key(),
        context=SealContext(job=job, round=round_, sender=sender.slug, recipient=recipient.slug),
        topic=topic,
    )  # fmt: skip
    return digest


def take(
    recipient: Party, sender: Party, job: str, digest: str, topic: str = "handoff", round_: int = 0
) -> bytes:
    return recipient.relay.take_handoff(
        keys=session_keys(), job=job, key=recipient.key, sender=sender.slug,
        sender_identity=sender.identity.public_key(),
        context=SealContext(job=job, round=round_, sender=sender.slug, recipient=recipient.slug),
        expected_sha256=digest, wait=0, stopping=threading.Event(), topic=topic,
    )  # fmt: skip


def lose_everything(raw: redis.Redis, job: str) -> None:
    """What a relay restarted without its data keeps of this job: nothing."""
    for key in raw.scan_iter(match=f"{session_keys().prefix}:*{{{job}}}*"):
        raw.delete(key)


def test_blobs_a_restarted_relay_lost_are_put_back_unchanged(
    redis_url: str, raw: redis.Redis, job: str
) -> None:
    sender, b, c = (Party(redis_url, slug, job) for slug in ("sender", "b", "c"))
    digests = {p.slug: hand_on(sender, p, job, f"weights for {p.slug}".encode()) for p in (b, c)}
    assert sender.relay.restore_handoffs(job) == 0, "nothing lost, nothing written again"
    lose_everything(raw, job)
    assert sender.relay.restore_handoffs(job) == 2
    assert take(b, sender, job, digests["b"]) == b"weights for b"
    assert take(c, sender, job, digests["c"]) == b"weights for c"
    assert sender.relay.restore_handoffs(job) == 0


def test_both_hand_off_slots_of_a_recipient_are_put_back(
    redis_url: str, raw: redis.Redis, job: str
) -> None:
    """A parallel plan leaves one recipient a blob in each of two slots (even and odd
    rounds): a restart loses both, and both come back, not only the latest."""
    sender, b = Party(redis_url, "sender", job), Party(redis_url, "b", job)
    even = hand_on(sender, b, job, b"round 0", topic="handoff", round_=0)
    odd = hand_on(sender, b, job, b"round 1", topic="handoff-odd", round_=1)
    lose_everything(raw, job)
    assert sender.relay.restore_handoffs(job) == 2
    assert take(b, sender, job, even, topic="handoff", round_=0) == b"round 0"
    assert take(b, sender, job, odd, topic="handoff-odd", round_=1) == b"round 1"


def test_a_restart_in_the_middle_of_a_hand_off_is_caught(
    redis_url: str, raw: redis.Redis, job: str
) -> None:
    """The blob left before the restart is gone, the one after it is there: the count in
    the mark shows the loss, where a mere flag would have been set again by the second."""
    sender, b, c = (Party(redis_url, slug, job) for slug in ("sender", "b", "c"))
    first = hand_on(sender, b, job, b"for b")
    lose_everything(raw, job)
    hand_on(sender, c, job, b"for c")
    assert sender.relay.restore_handoffs(job) == 2  # b's written again, c's left alone
    assert take(b, sender, job, first) == b"for b"
    assert sender.relay.restore_handoffs(job) == 0


def test_a_blob_still_there_is_left_alone_and_an_ended_job_is_forgotten(
    redis_url: str, raw: redis.Redis, job: str
) -> None:
    sender, b = Party(redis_url, "sender", job), Party(redis_url, "b", job)
    hand_on(sender, b, job, b"old")
    newer = hand_on(sender, b, job, b"new")  # a later turn's, under the same key
    raw.delete(session_keys().streams(job, "sender").up + ":seq")  # the workers' reset
    assert sender.relay.restore_handoffs(job) == 1
    assert take(b, sender, job, newer) == b"new"
    sender.relay.forget_handoffs(job)
    lose_everything(raw, job)
    assert sender.relay.restore_handoffs(job) == 0
