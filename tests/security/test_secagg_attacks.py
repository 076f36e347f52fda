"""Playing the attacker against secure aggregation: a hospital (or the relay) sends the
aggregator a vector of the wrong length or dtype, one for another round or job, one from
outside the round, a replay; or tampers with a sealed seed. Each time the round fails
naming the hospital, and no aggregate is made."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medsplit.errors import SealError
from medsplit.protocol.sealing import SealContext, seal, unseal
from medsplit.secagg import (
    GROUP,
    PAIR,
    Aggregator,
    MaskedSubmission,
    RoundFailed,
    RoundId,
    SealedSecret,
    SeedError,
    SubmissionRejected,
    VectorLayout,
)
from medsplit.secagg.masks import seal_secret
from tests.secagg_parties import exchange, hospital_rounds, make_keys, random_fronts

JOB = "job-attack"
NAMES = ["hosp-a", "hosp-b", "hosp-c"]
ROUND = RoundId(JOB, 5, 0, {"hosp-a": 10, "hosp-b": 20, "hosp-c": 30})


@pytest.fixture(scope="module")
def keys():
    return make_keys(JOB, [*NAMES, "mallory"])


@pytest.fixture
def masked(keys):
    """Honest masked submissions of the round, by hospital, and the layout's length."""
    fronts = random_fronts(NAMES, torch.Generator().manual_seed(0))
    layout = VectorLayout.of(fronts["hosp-a"])
    rounds = hospital_rounds(ROUND, keys, layout)
    exchange(rounds)
    return {h: rounds[h].mask(fronts[h]) for h in NAMES}, layout.length


def forged(sub: MaskedSubmission, **changes) -> bytes:
    fields = {
        "job": sub.job,
        "round": sub.round,
        "attempt": sub.attempt,
        "round_digest": sub.round_digest,
        "sender": sub.sender,
        "vector": sub.vector,
    }
    fields.update(changes)
    return MaskedSubmission(**fields).to_bytes()


def assert_round_failed(aggregator: Aggregator, hospital: str) -> None:
    """Nothing is averaged: the round takes nothing more and yields no aggregate."""
    assert aggregator.failed is not None and aggregator.failed.hospital == hospital
    with pytest.raises(RoundFailed, match=hospital) as failed:
        aggregator.aggregate()
    assert failed.value.hospital == hospital
    with pytest.raises(RoundFailed):
        aggregator.receive(b"", hospital="hosp-a")


def attack_cases(subs, length):
    a, c = subs["hosp-a"], subs["hosp-c"]
    return {
        "wrong length (short)": ("hosp-c", forged(c, vector=c.vector[:-1]), "values, not"),
        "wrong length (long)": (
            "hosp-c",
            forged(c, vector=np.concatenate([c.vector, c.vector[:1]])),
            "values, not",
        ),
        "wrong dtype (float32)": (
            "hosp-c",
            forged(c, vector=c.vector.view(np.float32)[:length].copy()),
            "float32, not uint64",
        ),
        "wrong dtype (int64)": ("hosp-c", forged(c, vector=c.vector.view(np.int64)), "int64"),
        "another round": ("hosp-c", forged(c, round=4), "round 4"),
        "another attempt": ("hosp-c", forged(c, attempt=1), "attempt 1"),
        "another job": ("hosp-c", forged(c, job="job-other"), "job 'job-other'"),
        "another participant set": (
            "hosp-c",
            forged(c, round_digest=ROUND.restart_without(["hosp-b"]).digest()),
            "another participant set",
        ),
        "an outsider": ("mallory", forged(c, sender="mallory"), "not a participant"),
        "a hospital posing as another": ("hosp-c", a.to_bytes(), "names 'hosp-a'"),
        "garbage": ("hosp-c", b"\x00" * 100, "not a valid submission"),
        "a truncated submission": ("hosp-c", c.to_bytes()[:-8], "truncated or padded"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "wrong length (short)",
        "wrong length (long)",
        "wrong dtype (float32)",
        "wrong dtype (int64)",
        "another round",
        "another attempt",
        "another job",
        "another participant set",
        "an outsider",
        "a hospital posing as another",
        "garbage",
        "a truncated submission",
    ],
)
def test_a_bad_submission_fails_the_round_naming_the_hospital(masked, case: str) -> None:
    subs, length = masked
    hospital, data, complaint = attack_cases(subs, length)[case]
    aggregator = Aggregator(ROUND, length)
    aggregator.receive(subs["hosp-a"].to_bytes(), hospital="hosp-a")
    aggregator.receive(subs["hosp-b"].to_bytes(), hospital="hosp-b")
    with pytest.raises(SubmissionRejected, match=complaint) as rejected:
        aggregator.receive(data, hospital=hospital)
    assert rejected.value.hospital == hospital and hospital in str(rejected.value)
    assert "nothing is averaged" in str(rejected.value)
    # Even the honest submission that would have completed the round is not taken.
    assert_round_failed(aggregator, hospital)


@pytest.mark.parametrize("same_bytes", [True, False])
def test_a_replayed_submission_fails_the_round(masked, same_bytes: bool) -> None:
    subs, length = masked
    aggregator = Aggregator(ROUND, length)
    aggregator.receive(subs["hosp-b"].to_bytes(), hospital="hosp-b")
    again = subs["hosp-b"] if same_bytes else subs["hosp-a"]
    replay = again.to_bytes() if same_bytes else forged(again, sender="hosp-b")
    with pytest.raises(SubmissionRejected, match="replayed") as rejected:
        aggregator.receive(replay, hospital="hosp-b")
    assert rejected.value.hospital == "hosp-b"
    assert_round_failed(aggregator, "hosp-b")


def test_a_submission_of_a_past_round_is_refused_in_the_next(masked) -> None:
    subs, length = masked
    later = Aggregator(RoundId(JOB, 6, 0, dict(ROUND.weights)), length)
    with pytest.raises(SubmissionRejected, match="round 5") as rejected:
        later.receive(subs["hosp-a"].to_bytes(), hospital="hosp-a")
    assert rejected.value.hospital == "hosp-a"


def test_a_tampered_sealed_seed_does_not_open(keys) -> None:
    layout = VectorLayout.of(random_fronts(["x"], torch.Generator().manual_seed(0))["x"])
    rounds = hospital_rounds(ROUND, keys, layout)
    seed = next(s for s in rounds["hosp-a"].outgoing() if s.kind == PAIR)
    for position in (len(seed.blob) // 2, -100, 200):  # ciphertext, signature, header
        blob = bytearray(seed.blob)
        blob[position] ^= 0x01
        with pytest.raises(SeedError, match="does not open"):
            rounds[seed.recipient].accept(
                SealedSecret(PAIR, seed.sender, seed.recipient, bytes(blob))
            )
    # Untouched, it opens: the tampering, not the blob, was refused.
    rounds[seed.recipient].accept(seed)


def test_a_seed_from_an_outsider_or_under_a_false_name_is_refused(keys) -> None:
    layout = VectorLayout.of(random_fronts(["x"], torch.Generator().manual_seed(0))["x"])
    rounds = hospital_rounds(ROUND, keys, layout)
    # mallory seals a seed to hosp-b under hosp-a's name, with her own identity key.
    blob = seal_secret(
        bytes(32),
        kind=PAIR,
        round_id=ROUND,
        sender="hosp-a",
        recipient="hosp-b",
        identity=keys["mallory"].identity,
        recipient_key=keys["hosp-b"].signed,
        recipient_identity=keys["hosp-b"].identity.public_key(),
    )
    with pytest.raises(SeedError, match="does not open"):
        rounds["hosp-b"].accept(SealedSecret(PAIR, "hosp-a", "hosp-b", blob))
    # A group key from someone other than the leader, or a pair seed drawn by the wrong
    # side of the pair, is not even opened.
    with pytest.raises(SeedError, match="expects no group secret from 'hosp-b'"):
        rounds["hosp-c"].accept(SealedSecret(GROUP, "hosp-b", "hosp-c", blob))
    with pytest.raises(SeedError, match="expects no pair secret from 'hosp-c'"):
        rounds["hosp-b"].accept(SealedSecret(PAIR, "hosp-c", "hosp-b", blob))
    with pytest.raises(SeedError, match="expects no pair secret from 'mallory'"):
        rounds["hosp-b"].accept(SealedSecret(PAIR, "mallory", "hosp-b", blob))


def test_a_hand_off_blob_cannot_pass_for_a_seed(keys) -> None:
    """A seed is sealed under its own purpose: a hand-off sealed for the same job, round
    and pair does not open as one (nor a seed as a hand-off)."""

    layout = VectorLayout.of(random_fronts(["x"], torch.Generator().manual_seed(0))["x"])
    rounds = hospital_rounds(ROUND, keys, layout)
    handoff = seal(
        bytes(80),
        sender=keys["hosp-a"].identity,
        recipient=keys["hosp-b"].signed,
        recipient_identity=keys["hosp-b"].identity.public_key(),
        context=SealContext(JOB, 5, "hosp-a", "hosp-b", "handoff"),
    )
    with pytest.raises(SeedError, match="purpose"):
        rounds["hosp-b"].accept(SealedSecret(PAIR, "hosp-a", "hosp-b", handoff))
    seed = next(s for s in rounds["hosp-a"].outgoing() if s.recipient == "hosp-b")
    with pytest.raises(SealError, match="purpose"):
        unseal(
            seed.blob,
            recipient=keys["hosp-b"].recipient,
            sender=keys["hosp-a"].identity.public_key(),
            context=SealContext(JOB, 5, "hosp-a", "hosp-b", "handoff"),
        )
