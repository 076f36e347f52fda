"""Record alignment by private set intersection (``medsplit.psi``), with the real
``openmined-psi`` library on both sides: identifiers, one two-party session, the K-way
intersection in its common order, its digest, and the epoch order of batches."""

from __future__ import annotations

import hashlib
import hmac
import random
import uuid
from pathlib import Path

import pytest

from medsplit.channel import RedisChannel
from medsplit.psi import (
    Alignment,
    DigestMismatch,
    IdentifierError,
    IntersectionTooSmall,
    PsiClient,
    PsiError,
    PsiServer,
    ServerReply,
    align,
    check_identifiers,
    common_order,
    epoch_batches,
    epoch_order,
    load_identifiers,
)

SESSION = "job-7/psi/hospital-a>hospital-b"
SEED = 20261201


def overlapping(size: int, overlap: float, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """Two shuffled identifier sets of ``size`` each, sharing ``overlap`` of them."""
    shared = int(size * overlap)
    common = [f"P{i:07d}" for i in range(shared)]
    a = common + [f"A{i:07d}" for i in range(size - shared)]
    b = common + [f"B{i:07d}" for i in range(size - shared)]
    rng = random.Random(seed)
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b


def run_session(client_ids: list[str], server_ids: list[str], **server_options) -> tuple:
    client = PsiClient(client_ids, session=SESSION)
    server = PsiServer(server_ids, session=SESSION, **server_options)
    reply = server.answer(client.request())
    return client.intersect(reply), server


def write_csv(path: Path, rows: list[str], header: str = "patient_id,age") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# Identifiers


def test_a_csv_column_is_read_in_file_order(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P3,41", "P1,52", "P2,60"])
    assert load_identifiers(path, column="patient_id") == ("P3", "P1", "P2")


def test_file_names_up_to_their_first_dot_are_identifiers(tmp_path: Path) -> None:
    for name in ["P2.png", "P10.nii.gz", "P1.png"]:
        (tmp_path / name).write_bytes(b"")
    assert load_identifiers(tmp_path) == ("P1", "P10", "P2")


def test_a_duplicate_identifier_names_the_file_and_both_lines(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P1,41", "P2,52", "P1,60"])
    with pytest.raises(IdentifierError, match=r"labels\.csv, line 4: .*'P1' repeats line 2") as e:
        load_identifiers(path, column="patient_id")
    assert (e.value.source, e.value.line) == (str(path), 4)


def test_an_empty_identifier_names_its_line(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P1,41", ",52"])
    with pytest.raises(IdentifierError, match=r"labels\.csv, line 3: empty identifier"):
        load_identifiers(path, column="patient_id")


def test_an_identifier_with_a_space_or_control_character_is_refused(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P1,41", "P2 ,52"])
    with pytest.raises(IdentifierError, match=r"line 3: identifier 'P2 ' holds ' '"):
        load_identifiers(path, column="patient_id")


def test_a_non_ascii_identifier_is_refused_not_normalised() -> None:
    with pytest.raises(IdentifierError, match=r"item 2: .*holds 'é'"):
        check_identifiers(["P1", "Pé"], source="ids")


def test_an_overlong_identifier_is_refused(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P" * 129 + ",41"])
    with pytest.raises(IdentifierError, match=r"line 2: identifier of 129 characters"):
        load_identifiers(path, column="patient_id")


def test_a_row_of_the_wrong_width_is_malformed(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P1,41", "P2"])
    with pytest.raises(IdentifierError, match=r"line 3: 1 fields where the header has 2"):
        load_identifiers(path, column="patient_id")


def test_text_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_bytes(b"patient_id,age\nP1,41\nP\xff2,52\n")
    with pytest.raises(IdentifierError, match=r"labels\.csv, line \d: not UTF-8"):
        load_identifiers(path, column="patient_id")


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", ["P1,41"])
    with pytest.raises(IdentifierError, match=r"line 1: column 'record' is not in the header"):
        load_identifiers(path, column="record")


def test_a_file_without_records_is_refused(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "labels.csv", [])
    with pytest.raises(IdentifierError, match="no identifiers"):
        load_identifiers(path, column="patient_id")


def test_two_files_of_one_identifier_name_both_files(tmp_path: Path) -> None:
    for name in ["P1.png", "P1.dcm"]:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(IdentifierError, match=r"file 2 \(P1\.png\): identifier 'P1' repeats"):
        load_identifiers(tmp_path)


# One two-party session


def test_the_client_learns_exactly_the_intersection_at_80_percent_overlap() -> None:
    a, b = overlapping(2000, 0.8)
    found, _ = run_session(a, b)
    assert set(found) == set(a) & set(b)
    assert len(found) == 1600
    assert list(found) == [i for i in a if i in set(b)]  # in the client's own order


def test_a_gcs_setup_gives_the_same_intersection_in_fewer_bytes() -> None:
    a, b = overlapping(2000, 0.8, seed=1)
    client = PsiClient(a, session=SESSION)
    raw = PsiServer(b, session=SESSION).answer(client.request())
    gcs = PsiServer(b, session=SESSION, structure="gcs").answer(client.request())
    assert client.intersect(gcs) == client.intersect(raw)
    assert len(gcs.setup) < len(raw.setup) / 4


def test_the_server_learns_only_the_client_set_size() -> None:
    a, b = overlapping(500, 0.8)
    _, server = run_session(a, b)
    assert server.client_size == 500


def test_disjoint_sets_intersect_to_nothing() -> None:
    found, _ = run_session(["A1", "A2"], ["B1", "B2"])
    assert found == ()


def test_a_gcs_setup_that_would_overflow_the_hash_range_is_refused() -> None:
    client = PsiClient([f"P{i}" for i in range(1000)], session=SESSION)
    server = PsiServer(
        [f"P{i}" for i in range(1000)], session=SESSION, structure="gcs", false_positive_rate=1e-14
    )
    with pytest.raises(PsiError, match="overflows openmined-psi's hash range"):
        server.answer(client.request())


def test_psi_messages_cross_a_real_redis_channel(redis_url: str) -> None:
    a, b = overlapping(300, 0.8, seed=2)
    stream = f"medsplit-test-psi-{uuid.uuid4()}"
    channel = RedisChannel(redis_url, chunk_bytes=4096)
    try:
        client = PsiClient(a, session=SESSION)
        server = PsiServer(b, session=SESSION)
        channel.send(f"{stream}:up", client.request())
        reply = server.answer(channel.receive(f"{stream}:up", timeout=10))
        channel.send(f"{stream}:down", reply.setup)
        channel.send(f"{stream}:down", reply.response)
        setup = channel.receive(f"{stream}:down", timeout=10)
        response = channel.receive(f"{stream}:down", timeout=10)
        assert set(client.intersect(ServerReply(setup, response))) == set(a) & set(b)
    finally:
        for name in (f"{stream}:up", f"{stream}:down"):
            channel.reset(name)
        channel.close()


# The K-way intersection


def test_three_parties_align_on_what_all_three_hold() -> None:
    label, other = overlapping(1000, 0.8, seed=3)
    third = [*label[:700], *(f"C{i}" for i in range(100))]
    pairwise = [run_session(label, other)[0], run_session(label, third)[0]]
    alignment = align(label, pairwise, seed=SEED, minimum=100)
    assert set(alignment.identifiers) == set(label) & set(other) & set(third)
    assert alignment.identifiers == common_order(alignment.identifiers, seed=SEED)


def test_the_order_is_the_same_whatever_order_the_inputs_came_in() -> None:
    a, b = overlapping(400, 0.8, seed=4)
    first = align(a, [[i for i in a if i in set(b)]], seed=SEED, minimum=10)
    shuffled = list(reversed(a))
    second = align(shuffled, [sorted(set(a) & set(b))], seed=SEED, minimum=10)
    assert first.identifiers == second.identifiers
    assert first.digest() == second.digest()


def test_the_order_depends_on_the_seed_not_on_the_identifiers_sort() -> None:
    ids = [f"P{i:04d}" for i in range(200)]
    assert common_order(ids, seed=1) != common_order(ids, seed=2)
    assert list(common_order(ids, seed=1)) != sorted(ids)


def test_the_digest_is_sha256_of_the_documented_encoding() -> None:
    ids = ["P1", "P2", "P3"]
    alignment = align(ids, [ids], seed=0, minimum=1)
    # docs/protocol.md's definition, written out independently of the module.
    key = hashlib.sha256(b"medsplit/psi/order/v1\0" + (0).to_bytes(8, "big")).digest()
    ordered = sorted(ids, key=lambda i: hmac.digest(key, i.encode(), "sha256"))
    encoding = b"medsplit/psi/intersection/v1\n" + len(ids).to_bytes(4, "big")
    encoding += b"".join(bytes([len(i)]) + i.encode() for i in ordered)
    assert alignment.identifiers == tuple(ordered)
    assert alignment.digest() == hashlib.sha256(encoding).hexdigest()


def test_the_digest_is_stable_across_runs() -> None:
    alignment = align(["P1", "P2", "P3"], [["P1", "P2", "P3"]], seed=0, minimum=1)
    # Fixed: a change of the order or of the encoding shows here.
    assert alignment.digest() == "6473b3cd139a0b0c4821da7042322d622483a127c5ef7028c98bcc0460c8a5f0"


def test_below_the_job_minimum_is_refused_with_size_and_minimum() -> None:
    a, b = overlapping(100, 0.08)
    with pytest.raises(
        IntersectionTooSmall, match="share 8 records, below the job's minimum of 20"
    ):
        align(a, [[i for i in a if i in set(b)]], seed=SEED, minimum=20)


def test_a_pairwise_result_outside_the_label_party_set_is_refused() -> None:
    with pytest.raises(PsiError, match="pairwise result 1 holds identifiers the label party lacks"):
        align(["P1", "P2"], [["P1", "X9"]], seed=SEED, minimum=1)


def test_another_party_reads_the_alignment_and_finds_its_rows() -> None:
    a, b = overlapping(300, 0.8, seed=5)
    alignment = align(a, [run_session(a, b)[0]], seed=SEED, minimum=10)
    received = Alignment.from_bytes(alignment.to_bytes(), seed=SEED, minimum=10)
    assert received == alignment
    rows = received.positions(b, source="hospital-b's features.csv")
    assert [b[r] for r in rows] == list(alignment.identifiers)


def test_an_aligned_identifier_a_party_lacks_is_refused() -> None:
    alignment = align(["P1", "P2", "P3"], [["P1", "P2", "P3"]], seed=SEED, minimum=1)
    with pytest.raises(PsiError, match=r"1 aligned identifiers are not in b\.csv"):
        alignment.positions(["P1", "P2"], source="b.csv")


def test_a_different_digest_stops_the_job() -> None:
    alignment = align(["P1", "P2", "P3"], [["P1", "P2"]], seed=SEED, minimum=1)
    other = align(["P1", "P2", "P3"], [["P1", "P3"]], seed=SEED, minimum=1)
    alignment.check_digest(alignment.digest(), party="hospital-b")
    with pytest.raises(DigestMismatch, match="hospital-b holds another intersection"):
        alignment.check_digest(other.digest(), party="hospital-b")


# Batches


def test_the_epoch_order_is_a_permutation_every_party_derives_alone() -> None:
    alignment = align(
        [f"P{i}" for i in range(500)], [[f"P{i}" for i in range(500)]], seed=SEED, minimum=1
    )
    order = epoch_order(alignment, seed=SEED, epoch=3)
    assert sorted(order) == list(range(500))
    again = Alignment.from_bytes(alignment.to_bytes(), seed=SEED, minimum=1)
    assert epoch_order(again, seed=SEED, epoch=3) == order


def test_each_epoch_has_its_own_order() -> None:
    alignment = align(
        [f"P{i}" for i in range(100)], [[f"P{i}" for i in range(100)]], seed=SEED, minimum=1
    )
    assert epoch_order(alignment, seed=SEED, epoch=0) != epoch_order(alignment, seed=SEED, epoch=1)


def test_batches_cover_the_epoch_order_and_drop_last_drops_the_short_one() -> None:
    alignment = align(
        [f"P{i}" for i in range(10)], [[f"P{i}" for i in range(10)]], seed=SEED, minimum=1
    )
    batches = epoch_batches(alignment, 4, seed=SEED, epoch=0)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [i for b in batches for i in b] == epoch_order(alignment, seed=SEED, epoch=0)
    assert len(epoch_batches(alignment, 4, seed=SEED, epoch=0, drop_last=True)) == 2


def test_a_seed_out_of_range_is_refused() -> None:
    alignment = align(["P1", "P2"], [["P1", "P2"]], seed=SEED, minimum=1)
    with pytest.raises(PsiError, match=r"seed must be an integer in 0..2\^64-1, got -1"):
        epoch_order(alignment, seed=-1, epoch=0)
