"""Attacks on a vertical job's record alignment: a hostile party's malformed PSI message
or foreign intersection, a relay owner's altered blob, a different digest at the
coordinator. Each ends in a clear error (or a failed job) before anything trains."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis

from hospital_agent.alignment import (
    ALIGNMENT_FILE,
    ALIGNMENT_TOPIC,
    MAX_ANSWERS,
    PSI_TOPIC,
    REPLY_MAGIC,
    AlignmentFailed,
    pack_reply,
)
from kernel.actors import Actor, ActorKind
from medsplit.errors import SealError
from medsplit.protocol.sealing import SealContext, seal, unseal
from medsplit.psi import Alignment, PsiClient, PsiServer
from medsplit.psi.alignment import common_order
from medsplit.psi.errors import PsiError, PsiMessageError
from tests.alignment_parties import PartyBoard, SharedBoard, consortium, records, run_all
from tests.redis_server import session_keys
from training import services
from training.alignment import alignment_report
from training.models import Job, Turn
from training.states import JobState

__all__ = ["consortium"]

IDS = [f"R{i:03d}" for i in range(60)]


def pair(consortium):
    label = consortium.party("lab", records(IDS[:40], features=2, labelled=True, seed=1))
    other = consortium.party("clinic", records(IDS[10:], features=3, labelled=False, seed=2))
    participants = [label.participant(), other.participant()]
    return label, other, participants, SharedBoard(["lab", "clinic"], 5)


def sealed_mail(sender, recipient, *, purpose: str, topic: str, data: bytes) -> None:
    """What a hostile ``sender`` can do: seal any bytes for ``recipient``, correctly."""
    blob = seal(
        data,
        sender=sender.identity,
        recipient=recipient.signed,
        recipient_identity=recipient.identity.public_key(),
        context=SealContext(
            job=f"job-{sender.job}",
            round=0,
            sender=sender.slug,
            recipient=recipient.slug,
            purpose=purpose,
        ),
    )
    sender.relay.put_mail(
        keys=session_keys(),
        job=f"job-{sender.job}",
        recipient=recipient.slug,
        topic=topic,
        blob=blob,
        ttl=60,
    )


def nothing_handed_on(consortium, label, other, board) -> None:
    client = consortium.admin()
    try:
        key = session_keys().mail(
            f"job-{label.job}", sender=label.slug, recipient=other.slug, topic=ALIGNMENT_TOPIC
        )
        assert client.get(key) is None
    finally:
        client.close()
    assert not (label.folder / ALIGNMENT_FILE).exists()
    assert board.reports == {}


def test_a_malformed_psi_reply_stops_the_label_party(consortium) -> None:
    label, other, participants, board = pair(consortium)

    def hostile() -> None:
        # It answers with a well-sealed reply of its own making: the request's digest
        # (so it is not taken for a stale one), then a setup and response of garbage.
        while (
            blob := other.relay.get_mail(
                keys=session_keys(), job=f"job-{label.job}", sender="lab", topic=PSI_TOPIC
            )
        ) is None:
            time.sleep(0.05)
        request = _unseal(other, label, blob)
        forged = REPLY_MAGIC + hashlib.sha256(request).digest() + (8).to_bytes(4, "big")
        sealed_mail(other, label, purpose="psi-reply", topic=PSI_TOPIC, data=forged + bytes(50))

    results = run_all(
        {"lab": lambda: label.align(participants, PartyBoard(board, "lab")), "clinic": hostile}
    )
    error = results["lab"]
    assert isinstance(error, PsiMessageError), error
    assert "the PSI reply of clinic" in str(error)
    nothing_handed_on(consortium, label, other, board)


def test_a_reply_of_another_set_is_refused(consortium) -> None:
    """A reply computed for another request (a replay) is waited past, not taken; a reply
    to this request whose response drops points is refused."""
    label, other, participants, board = pair(consortium)

    def hostile() -> None:
        while (
            blob := other.relay.get_mail(
                keys=session_keys(), job=f"job-{label.job}", sender="lab", topic=PSI_TOPIC
            )
        ) is None:
            time.sleep(0.05)
        request = _unseal(other, label, blob)
        server = PsiServer(other.records.identifiers, session=f"job-{label.job}/psi/lab/clinic")
        reply = server.answer(request)
        broken = type(reply)(reply.setup, reply.response[:-40])
        sealed_mail(
            other, label, purpose="psi-reply", topic=PSI_TOPIC, data=pack_reply(request, broken)
        )

    results = run_all(
        {"lab": lambda: label.align(participants, PartyBoard(board, "lab")), "clinic": hostile}
    )
    assert isinstance(results["lab"], PsiMessageError), results["lab"]
    nothing_handed_on(consortium, label, other, board)


def test_a_request_altered_on_the_relay_is_refused(consortium) -> None:
    label, other, participants, board = pair(consortium)
    key = session_keys().mail(f"job-{label.job}", sender="lab", recipient="clinic", topic=PSI_TOPIC)
    admin = consortium.admin()

    def relay_owner() -> None:
        while (blob := admin.get(key)) is None:
            time.sleep(0.05)
        altered = bytearray(blob)
        altered[len(altered) // 2] ^= 1
        admin.set(key, bytes(altered))

    relay_owner_runs = run_all(
        {
            "lab": lambda: label.align(participants, PartyBoard(board, "lab"), timeout=2.0),
            "owner": relay_owner,
        }
    )
    assert relay_owner_runs["owner"] is None
    assert isinstance(relay_owner_runs["lab"], AlignmentFailed)  # no reply came
    with pytest.raises(SealError):
        other.align(participants, PartyBoard(board, "clinic"), timeout=2.0)
    admin.close()
    assert "clinic" not in board.reports


def test_a_label_party_probing_with_many_sets_is_answered_three_times(consortium) -> None:
    """Each answer tells the label party the intersection with the set it sent: a party
    answers a few fresh requests (a restarted label party's), not one per guess."""
    label, other, participants, board = pair(consortium)
    job = f"job-{label.job}"

    def probe() -> None:
        for number in range(MAX_ANSWERS + 1):
            guess = [f"G{number}-{i}" for i in range(20)] + IDS[10 + number : 12 + number]
            request = PsiClient(guess, session=f"{job}/psi/lab/clinic").request()
            sealed_mail(label, other, purpose="psi-request", topic=PSI_TOPIC, data=request)
            if number == MAX_ANSWERS:
                return  # this one is refused: no reply to wait for
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                reply = label.relay.get_mail(
                    keys=session_keys(), job=job, sender="clinic", topic=PSI_TOPIC
                )
                if (
                    reply is not None
                    and _unseal(label, other, reply, "psi-reply")[
                        len(REPLY_MAGIC) : len(REPLY_MAGIC) + 32
                    ]
                    == hashlib.sha256(request).digest()
                ):
                    break
                time.sleep(0.05)

    results = run_all(
        {"clinic": lambda: other.align(participants, PartyBoard(board, "clinic")), "probe": probe}
    )
    assert isinstance(results["clinic"], AlignmentFailed), results["clinic"]
    assert f"more than {MAX_ANSWERS} PSI requests" in str(results["clinic"])


def test_a_foreign_intersection_from_the_label_party_is_refused(consortium) -> None:
    label, other, participants, board = pair(consortium)
    # The "label party" hands on identifiers the other does not hold (to learn which of
    # a guessed list it holds, say): refused, nothing reported.
    guessed = Alignment(common_order(("R000", "R001", "R050", "R051", "R052", "R053"), seed=7), 7)
    sealed_mail(label, other, purpose="alignment", topic=ALIGNMENT_TOPIC, data=guessed.to_bytes())
    with pytest.raises(
        AlignmentFailed, match="2 of the 6 aligned identifiers are not in clinic's"
    ) as e:
        other.align(participants, PartyBoard(board, "clinic"), timeout=5.0)
    assert board.reports == {}
    assert "R000" not in str(e.value)  # counted, never named
    assert not (other.folder / ALIGNMENT_FILE).exists()


def test_an_intersection_in_a_chosen_order_is_refused(consortium) -> None:
    label, other, participants, board = pair(consortium)
    chosen = sorted(IDS[10:40])  # the label party's own order, not the seed's
    body = Alignment(common_order(tuple(chosen), seed=7), 7).to_bytes()
    count = len(chosen)
    encoded = b"".join(bytes([len(i)]) + i.encode() for i in chosen)
    forged = body[: len(body) - len(encoded)] + encoded
    assert len(forged) == len(body) and count == 30
    sealed_mail(label, other, purpose="alignment", topic=ALIGNMENT_TOPIC, data=forged)
    with pytest.raises(PsiError, match="common order"):
        other.align(participants, PartyBoard(board, "clinic"), timeout=5.0)


def test_a_party_cannot_forge_another_partys_reply(consortium) -> None:
    label = consortium.party("lab", records(IDS[:40], features=2, labelled=True, seed=1))
    consortium.party("clinic", records(IDS[10:], features=3, labelled=False, seed=2))
    mallory = consortium.party("mallory", records(IDS, features=1, labelled=False, seed=3))
    key = session_keys().mail(f"job-{label.job}", sender="clinic", recipient="lab", topic=PSI_TOPIC)
    client = mallory.relay._client()
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(key, b"forged")
    finally:
        client.close()


@pytest.mark.django_db
def test_a_different_digest_at_the_coordinator_fails_the_job_before_training(
    make_job, three_hospitals
) -> None:
    job = services.job_start(
        job=make_job(
            state="scheduled",
            mode="vertical",
            cuts=["pool1", "pool"],
            mode_options={"min_records": 10},
        )
    )
    running = Turn.objects.filter(job=job, status=Turn.Status.RUNNING)
    a, b, c = three_hospitals
    for hospital, digest in ((a, "11" * 32), (b, "11" * 32), (c, "66" * 32)):
        alignment_report(
            actor=Actor(ActorKind.HOSPITAL, hospital=hospital),
            job_id=job.pk,
            digest=digest,
            size=30,
        )
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "the parties hold different intersections" in job.state_reason
    assert not running.exists()  # the running turn ended with the job: nothing trains
    assert Job.objects.get(pk=job.pk).alignment.status == "mismatch"


def _unseal(me, sender, blob: bytes, purpose: str = "psi-request") -> bytes:
    return unseal(
        blob,
        recipient=me.job_keys.load(me.job),
        sender=sender.identity.public_key(),
        context=SealContext(
            job=f"job-{me.job}",
            round=0,
            sender=sender.slug,
            recipient=me.slug,
            purpose=purpose,
        ),
    )
