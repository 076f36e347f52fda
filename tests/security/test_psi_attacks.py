"""Attacks on record alignment (``medsplit.psi``): what crosses the relay holds no
identifier in the clear, and altered, truncated, replayed or forged messages are refused
before the curve arithmetic runs (or by it)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from medsplit.psi import (
    Alignment,
    PsiClient,
    PsiError,
    PsiMessageError,
    PsiRequest,
    PsiResponse,
    PsiServer,
    PsiSetup,
    ServerReply,
    align,
)

SESSION = "job-9/psi/hospital-a>hospital-b"
SEED = 77


def parties(size: int = 300) -> tuple[PsiClient, PsiServer, ServerReply]:
    client_ids = [f"MRN-{i:06d}" for i in range(size)]
    server_ids = [f"MRN-{i:06d}" for i in range(size // 5, size + size // 5)]
    client = PsiClient(client_ids, session=SESSION)
    server = PsiServer(server_ids, session=SESSION)
    return client, server, server.answer(client.request())


def forged(body: bytes) -> bytes:
    """``body`` with a valid trailing checksum, as a forger who recomputes it would send."""
    return body + hashlib.sha256(body).digest()


def test_no_message_holds_a_client_identifier_in_the_clear() -> None:
    client, _, reply = parties()
    sent = client.request() + reply.setup + reply.response
    for identifier in client.identifiers:
        encoded = identifier.encode()
        # Neither the identifier nor its plain SHA-256 (a dictionary attacker's first try).
        assert encoded not in sent, identifier
        assert hashlib.sha256(encoded).digest() not in sent, identifier


def test_the_server_messages_hold_no_server_identifier_in_the_clear() -> None:
    _, server, reply = parties()
    sent = reply.setup + reply.response
    assert not any(i.encode() in sent for i in server.identifiers)


@pytest.mark.parametrize("which", ["request", "setup", "response"])
def test_a_flipped_byte_anywhere_is_refused(which: str) -> None:
    client, server, reply = parties(50)
    data = {"request": client.request(), "setup": reply.setup, "response": reply.response}[which]
    for at in range(0, len(data), 97):
        altered = bytearray(data)
        altered[at] ^= 0x01
        with pytest.raises(PsiMessageError):
            if which == "request":
                server.answer(bytes(altered))
            elif which == "setup":
                client.intersect(ServerReply(bytes(altered), reply.response))
            else:
                client.intersect(ServerReply(reply.setup, bytes(altered)))


@pytest.mark.parametrize("keep", [0, 7, 40, -33, -1])
def test_a_truncated_response_is_refused(keep: int) -> None:
    client, _, reply = parties(50)
    with pytest.raises(PsiMessageError, match=r"truncated|checksum"):
        client.intersect(ServerReply(reply.setup, reply.response[:keep]))


def test_a_message_of_another_session_is_refused() -> None:
    client = PsiClient(["P1", "P2"], session="job-9/psi/hospital-a>hospital-c")
    server = PsiServer(["P1", "P2"], session=SESSION)
    with pytest.raises(PsiMessageError, match="of session 'job-9/psi/hospital-a>hospital-c'"):
        server.answer(client.request())


def test_a_reply_to_an_earlier_request_is_refused() -> None:
    client, _, old_reply = parties(50)
    fresh = PsiClient(client.identifiers, session=SESSION)
    fresh.request()
    with pytest.raises(PsiMessageError, match="answers another request"):
        fresh.intersect(old_reply)


def test_a_response_that_drops_points_is_refused() -> None:
    client, _, reply = parties(50)
    response = PsiResponse.from_bytes(
        reply.response,
        session=SESSION,
        answers=PsiRequest.from_bytes(client.request(), session=SESSION).digest(),
    )
    short = PsiResponse(SESSION, response.answers, response.points[:-33])
    with pytest.raises(PsiMessageError, match="49 points for a request of 50"):
        client.intersect(ServerReply(reply.setup, short.to_bytes()))


def test_a_forged_request_with_a_point_off_the_curve_is_refused() -> None:
    _, server, _ = parties(10)
    header = b"MSPSI" + bytes([1, 1, len(SESSION)]) + SESSION.encode()
    body = header + struct.pack(">I", 1) + b"\x02" + b"\xff" * 32
    with pytest.raises(PsiMessageError, match="refused by openmined-psi"):
        server.answer(forged(body))


def test_a_forged_request_over_the_size_bound_is_refused_before_reading_it() -> None:
    _, server, _ = parties(10)
    header = b"MSPSI" + bytes([1, 1, len(SESSION)]) + SESSION.encode()
    body = header + struct.pack(">I", 2_000_001) + b"\x02" * 33
    with pytest.raises(PsiMessageError, match="2,000,001 points"):
        server.answer(forged(body))


def test_a_raw_setup_in_the_server_own_order_is_refused() -> None:
    client, _, reply = parties(50)
    answers = PsiRequest.from_bytes(client.request(), session=SESSION).digest()
    setup = PsiSetup.from_bytes(reply.setup, session=SESSION, answers=answers)
    points = setup.elements()
    unsorted = b"".join([points[1], points[0], *points[2:]])
    body = PsiSetup(SESSION, answers, "raw", points=setup.points).to_bytes()[:-32]
    body = body[: -len(setup.points)] + unsorted
    with pytest.raises(PsiMessageError, match="not sorted"):
        client.intersect(ServerReply(forged(body), reply.response))


def test_a_message_of_another_format_version_is_refused() -> None:
    client, server, _ = parties(10)
    request = bytearray(client.request()[:-32])
    request[5] = 2
    with pytest.raises(PsiMessageError, match="format 2; this side reads format 1"):
        server.answer(forged(bytes(request)))


def test_a_request_in_place_of_a_response_is_refused() -> None:
    client, _, reply = parties(10)
    with pytest.raises(PsiMessageError, match="expected a PSI response, got kind request"):
        client.intersect(ServerReply(reply.setup, client.request()))


def test_an_alignment_in_a_chosen_order_is_refused() -> None:
    """A label party that hands on its own order (one that could encode its files' row
    order) is refused: the order is the seed's, and every party checks it."""
    alignment = align(
        [f"P{i}" for i in range(20)], [[f"P{i}" for i in range(20)]], seed=SEED, minimum=1
    )
    ids = list(alignment.identifiers)
    ids[0], ids[1] = ids[1], ids[0]
    encoded = alignment.to_bytes()
    magic_and_count = encoded[: len(encoded) - sum(1 + len(i) for i in ids)]
    chosen = magic_and_count + b"".join(bytes([len(i)]) + i.encode() for i in ids)
    with pytest.raises(PsiError, match="common order"):
        Alignment.from_bytes(chosen, seed=SEED, minimum=1)


def test_an_alignment_below_the_minimum_is_refused_by_the_receiver() -> None:
    alignment = align(["P1", "P2", "P3"], [["P1", "P2", "P3"]], seed=SEED, minimum=1)
    with pytest.raises(PsiError, match="share 3 records, below the job's minimum of 5"):
        Alignment.from_bytes(alignment.to_bytes(), seed=SEED, minimum=5)
