"""hospital_agent.alignment: parties in threads align their records over a real Redis
relay (each its own ACL user), with real PSI and real sealing."""

from __future__ import annotations

import pytest
import torch

from hospital_agent.alignment import ALIGNMENT_FILE, AlignmentFailed, pack_reply, unpack_reply
from medsplit.psi import Alignment, PsiClient, PsiServer
from medsplit.psi.alignment import common_order
from medsplit.psi.errors import DigestMismatch, IntersectionTooSmall, PsiMessageError
from tests.alignment_parties import PartyBoard, SharedBoard, consortium, records, run_all

__all__ = ["consortium"]

IDS = [f"P{i:03d}" for i in range(100)]


def three(consortium, *, minimum: int = 5):
    label = consortium.party("lab", records(IDS[0:60], features=3, labelled=True, seed=1))
    one = consortium.party("imaging", records(IDS[10:80], features=4, labelled=False, seed=2))
    two = consortium.party("genomics", records(IDS[20:100], features=2, labelled=True, seed=3))
    parties = [label, one, two]
    board = SharedBoard([p.slug for p in parties], minimum)
    return parties, [p.participant() for p in parties], board


def row_of(party, identifier: str) -> int:
    return party.records.identifiers.index(identifier)


def test_three_parties_align_on_one_intersection_in_one_order(consortium) -> None:
    parties, participants, board = three(consortium)
    results = run_all(
        {p.slug: (lambda p=p: p.align(participants, PartyBoard(board, p.slug))) for p in parties}
    )
    expected = Alignment(common_order(tuple(IDS[20:60]), seed=7), 7)
    for party in parties:
        aligned = results[party.slug]
        assert not isinstance(aligned, BaseException), aligned
        assert aligned.alignment == expected
        rows = [row_of(party, i) for i in expected.identifiers]
        assert torch.equal(aligned.features, party.records.features[rows])
        if party.slug == "lab":
            assert torch.equal(aligned.labels, party.records.labels[rows])
        else:
            assert aligned.labels is None  # only the label party's labels count
        assert (party.folder / ALIGNMENT_FILE).stat().st_mode & 0o077 == 0
    assert board.state()["status"] == "agreed" and board.state()["size"] == 40


def test_a_later_turn_reuses_the_kept_alignment_without_psi(consortium) -> None:
    parties, participants, board = three(consortium)
    first = run_all(
        {p.slug: (lambda p=p: p.align(participants, PartyBoard(board, p.slug))) for p in parties}
    )

    class NoRelay:
        def __getattr__(self, name: str):
            raise AssertionError(f"the relay was used ({name})")

    again = parties[1].align(participants, PartyBoard(board, "imaging"), relay=NoRelay())
    assert again.alignment == first["imaging"].alignment
    assert torch.equal(again.features, first["imaging"].features)
    # The label party hands the intersection on again (a party may have missed it).
    again = parties[0].align(participants, PartyBoard(board, "lab"))
    assert torch.equal(again.labels, first["lab"].labels)


def test_a_kept_alignment_that_no_longer_fits_the_records_is_refused(consortium) -> None:
    parties, participants, board = three(consortium)
    run_all(
        {p.slug: (lambda p=p: p.align(participants, PartyBoard(board, p.slug))) for p in parties}
    )
    imaging = parties[1]
    imaging.records = records(IDS[30:80], features=4, labelled=False, seed=2)
    with pytest.raises(AlignmentFailed, match="no longer fits"):
        imaging.align(participants, PartyBoard(board, "imaging"))
    (imaging.folder / ALIGNMENT_FILE).write_bytes(b"not an alignment")
    with pytest.raises(AlignmentFailed, match="wrong magic"):
        imaging.align(participants, PartyBoard(board, "imaging"))


def test_an_intersection_below_the_minimum_stops_every_party(consortium) -> None:
    parties, participants, board = three(consortium, minimum=41)
    results = run_all(
        {
            p.slug: (lambda p=p: p.align(participants, PartyBoard(board, p.slug), minimum=41))
            for p in parties
        }
    )
    for party in parties:
        assert isinstance(results[party.slug], IntersectionTooSmall), results[party.slug]
    assert "40 records, below the job's minimum of 41" in str(results["lab"])
    assert board.state()["status"] == "too_small"
    for party in parties:  # nobody keeps (or was handed) the intersection
        assert not (party.folder / ALIGNMENT_FILE).exists()


def test_two_parties_with_nothing_in_common(consortium) -> None:
    label = consortium.party("lab", records(IDS[:10], features=1, labelled=True, seed=1))
    other = consortium.party("clinic", records(IDS[10:20], features=1, labelled=False, seed=2))
    participants = [label.participant(), other.participant()]
    board = SharedBoard(["lab", "clinic"], 1)
    results = run_all(
        {
            p.slug: (lambda p=p: p.align(participants, PartyBoard(board, p.slug), minimum=1))
            for p in (label, other)
        }
    )
    assert isinstance(results["lab"], IntersectionTooSmall) and results["lab"].size == 0
    assert isinstance(results["clinic"], IntersectionTooSmall)


class LyingBoard(PartyBoard):
    """A party that tells the coordinator another digest than the one it holds."""

    def report_alignment(self, *, job: int, digest: str, size: int) -> dict:
        return super().report_alignment(job=job, digest="00" * 32, size=size)


def test_a_mismatch_at_the_coordinator_stops_every_party(consortium) -> None:
    parties, participants, board = three(consortium)
    boards = {p.slug: PartyBoard(board, p.slug) for p in parties}
    boards["genomics"] = LyingBoard(board, "genomics")
    results = run_all(
        {p.slug: (lambda p=p: p.align(participants, boards[p.slug])) for p in parties}
    )
    for party in parties:
        assert isinstance(results[party.slug], DigestMismatch), results[party.slug]
        assert "different intersections" in str(results[party.slug])


def test_a_silent_party_times_out_clearly(consortium) -> None:
    parties, participants, board = three(consortium)
    with pytest.raises(AlignmentFailed, match="no PSI replies from imaging, genomics within 1 s"):
        parties[0].align(participants, PartyBoard(board, "lab"), timeout=1.0)


def test_the_reply_layout() -> None:
    client = PsiClient(["a", "b"], session="s")
    request = client.request()
    reply = PsiServer(["b", "c"], session="s").answer(request)
    _, unpacked = unpack_reply(pack_reply(request, reply))
    assert unpacked == reply and client.intersect(unpacked) == ("b",)
    for bad in (b"", b"MSPSIREPLY1" + bytes(36), pack_reply(request, reply)[:60]):
        with pytest.raises(PsiMessageError):
            unpack_reply(bad)
