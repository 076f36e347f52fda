"""Secure aggregation's core: the ring arithmetic, masks that cancel, the aggregate equal
bit for bit to the weighted average computed in the clear, the dropout rule, and a round
through a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
import torch

from medsplit.channel.redis import RedisChannel
from medsplit.secagg import (
    Aggregate,
    Aggregator,
    FixedPoint,
    FixedPointError,
    MaskedSubmission,
    MessageError,
    RoundId,
    RoundIncomplete,
    SealedSecret,
    SecAggError,
    SeedError,
    SubmissionRejected,
    VectorLayout,
    clear_weighted_sum,
    group_mask,
    keystream_u64,
    pair_mask,
)
from tests.secagg_parties import exchange, hospital_rounds, make_keys, random_fronts

JOB = "job-secagg"
NAMES = ["hosp-a", "hosp-b", "hosp-c"]
WEIGHTS = {"hosp-a": 120, "hosp-b": 45, "hosp-c": 301}


@pytest.fixture(scope="module")
def keys():
    return make_keys(JOB, [f"hosp-{c}" for c in "abcdefghij"])


def run_round(round_id, keys, fronts, fixed=None):
    """Every hospital masks, the aggregator sums, each hospital unmasks: their results."""
    layout = VectorLayout.of(next(iter(fronts.values())))
    rounds = hospital_rounds(round_id, keys, layout, fixed)
    exchange(rounds)
    aggregator = Aggregator(round_id, layout.length)
    for name in round_id.participants:
        aggregator.receive(rounds[name].mask(fronts[name]).to_bytes(), hospital=name)
    aggregate = Aggregate.from_bytes(aggregator.aggregate().to_bytes())
    return {name: rounds[name].unmask(aggregate) for name in round_id.participants}


def clear_average(round_id, fronts, fixed):
    """The fixed-point weighted average computed in the clear, decoded the same way."""
    layout = VectorLayout.of(next(iter(fronts.values())))
    names = round_id.participants
    ring = clear_weighted_sum(
        [layout.flatten(fronts[h]) for h in names], [round_id.weights[h] for h in names], fixed
    )
    return layout.unflatten(fixed.decode(ring, round_id.total_weight))


# -- exactness ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5, 10])
def test_the_aggregate_equals_the_clear_fixed_point_average_bit_for_bit(keys, k: int) -> None:
    names = [f"hosp-{c}" for c in "abcdefghij"][:k]
    round_id = RoundId(JOB, 4, 0, {h: 17 * i + 3 for i, h in enumerate(names)})
    fronts = random_fronts(names, torch.Generator().manual_seed(k))
    fixed = FixedPoint()
    results = run_round(round_id, keys, fronts, fixed)
    expected = clear_average(round_id, fronts, fixed)
    for name in names:  # every hospital gets the same weights, equal to the clear ones
        assert results[name].keys() == expected.keys()
        for tensor in expected:
            assert torch.equal(results[name][tensor], expected[tensor])


def test_the_fixed_point_error_stays_within_the_documented_bound() -> None:
    fixed = FixedPoint()
    generator = torch.Generator().manual_seed(7)
    worst = 0.0
    for trial in range(20):
        weights = [int(w) for w in torch.randint(1, 5000, (4,), generator=generator)]
        scale = 10.0 ** (trial % 5 - 2)  # values from about 0.01 to 100
        vectors = [torch.randn(4096, generator=generator) * scale for _ in weights]
        ring = clear_weighted_sum(vectors, weights, fixed)
        decoded = fixed.decode(ring, sum(weights)).double()
        # Products and sums of float32 values by small integers are exact in float64.
        exact = sum(w * v.double() for w, v in zip(weights, vectors, strict=True)) / sum(weights)
        error = (decoded - exact).abs()
        assert bool((error <= fixed.error_bound(exact)).all())
        worst = max(worst, float((error - 2.0**-24 * exact.abs()).max()))
    # The fixed-point part alone: within one 2^-24 step (and the float32 rounding of that
    # step, and float64's own rounding of the reference).
    assert worst <= 2.0**-24 * (1 + 2.0**-24) + 1e-12


def test_fixed_point_refuses_what_would_wrap_nan_and_other_dtypes() -> None:
    fixed = FixedPoint()
    with pytest.raises(FixedPointError, match="does not fit the ring"):
        fixed.encode(torch.tensor([2.0**30]), 1, 2)
    with pytest.raises(FixedPointError, match="does not fit the ring"):
        fixed.encode(torch.tensor([2.0**20]), 1, 2**20)  # the total weight counts
    with pytest.raises(FixedPointError, match="NaN or infinite"):
        fixed.encode(torch.tensor([1.0, float("nan")]), 1, 2)
    with pytest.raises(FixedPointError, match="float32"):
        fixed.encode(torch.tensor([1.0], dtype=torch.float64), 1, 2)
    with pytest.raises(FixedPointError, match="exceeds the total"):
        fixed.encode(torch.tensor([1.0]), 3, 2)
    with pytest.raises(FixedPointError, match="scale_bits"):
        FixedPoint(53)


def test_negative_values_and_ties_decode_as_documented() -> None:
    fixed = FixedPoint(2)  # a resolution of 1/4, to see the rounding
    ring = clear_weighted_sum([torch.tensor([-0.75, 0.25, -0.25])], [1], fixed)
    assert ring.view(np.int64).tolist() == [-3, 1, -1]
    # Σ = -3 + 0 over N = 2: -1.5 steps, ties round up to -1 step = -0.25.
    ring = clear_weighted_sum([torch.tensor([-0.75]), torch.tensor([0.0])], [1, 1], fixed)
    assert fixed.decode(ring, 2).tolist() == [-0.25]


# -- masks -------------------------------------------------------------------------------


def test_masks_are_bound_to_round_attempt_pair_and_length() -> None:
    seed = bytes(range(32))
    base = RoundId(JOB, 1, 0, {"hosp-a": 1, "hosp-b": 2, "hosp-c": 3})
    mask = pair_mask(seed, base, "hosp-a", "hosp-b", 64)
    assert mask.dtype == np.uint64 and mask.shape == (64,)
    assert np.array_equal(mask, pair_mask(seed, base, "hosp-a", "hosp-b", 64))
    others = [
        pair_mask(seed, RoundId(JOB, 2, 0, dict(base.weights)), "hosp-a", "hosp-b", 64),
        pair_mask(seed, RoundId(JOB, 1, 1, dict(base.weights)), "hosp-a", "hosp-b", 64),
        pair_mask(seed, RoundId("job-other", 1, 0, dict(base.weights)), "hosp-a", "hosp-b", 64),
        pair_mask(seed, base.restart_without(["hosp-c"]), "hosp-a", "hosp-b", 64),
        pair_mask(seed, base, "hosp-a", "hosp-c", 64),
        pair_mask(seed, base, "hosp-a", "hosp-b", 65)[:64],
        group_mask(seed, base, 64),
    ]
    for other in others:
        assert not np.array_equal(mask, other)
    with pytest.raises(SecAggError, match="ordered pair"):
        pair_mask(seed, base, "hosp-b", "hosp-a", 64)


def test_the_keystream_is_chacha20() -> None:
    # RFC 8439 section 2.4.2's key with a zero nonce and counter; ChaCha20 of zeros is the
    # key stream, so this pins the cipher (against a stand-in PRNG).
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    key = bytes(range(32))
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    expected = np.frombuffer(encryptor.update(bytes(80)), dtype="<u8")
    assert np.array_equal(keystream_u64(key, 10), expected)


# -- messages ----------------------------------------------------------------------------


def test_messages_round_trip_and_refuse_truncation_padding_and_other_kinds() -> None:
    round_id = RoundId(JOB, 3, 2, WEIGHTS)
    vector = np.arange(10, dtype=np.uint64) * np.uint64(2**61)
    sub = MaskedSubmission.for_round(round_id, "hosp-a", vector)
    data = sub.to_bytes()
    back = MaskedSubmission.from_bytes(data)
    assert (back.job, back.round, back.attempt, back.sender, back.dtype) == (
        JOB,
        3,
        2,
        "hosp-a",
        "uint64",
    )
    assert back.round_digest == round_id.digest() and np.array_equal(back.vector, vector)
    for bad, complaint in [
        (data[:-1], "truncated or padded"),
        (data + b"\x00", "truncated or padded"),
        (b"XXXXXXXX" + data[8:], "not a secure-aggregation message"),
        (data[:8] + b"\x09" + data[9:], "format version 9"),
        (data[:30], "truncated"),
    ]:
        with pytest.raises(MessageError, match=complaint):
            MaskedSubmission.from_bytes(bad)
    with pytest.raises(MessageError, match="expected a Aggregate"):
        Aggregate.from_bytes(data)
    # A mutable buffer is copied: changing it afterwards changes no parsed vector.
    buffer = bytearray(data)
    parsed = MaskedSubmission.from_bytes(buffer)
    buffer[-8:] = bytes(8)
    assert np.array_equal(parsed.vector, vector)


# -- dropouts ----------------------------------------------------------------------------


def test_a_dropout_restarts_the_round_without_it_with_fresh_seeds(keys) -> None:
    round_id = RoundId(JOB, 6, 0, WEIGHTS)
    fronts = random_fronts(NAMES, torch.Generator().manual_seed(3))
    layout = VectorLayout.of(fronts["hosp-a"])
    first = hospital_rounds(round_id, keys, layout)
    exchange(first)  # the masks are fixed
    aggregator = Aggregator(round_id, layout.length)
    old = {h: first[h].mask(fronts[h]).to_bytes() for h in ("hosp-a", "hosp-b")}
    for h, data in old.items():
        aggregator.receive(data, hospital=h)
    # hosp-c dropped out: the round cannot end, and says who is missing.
    with pytest.raises(RoundIncomplete, match="hosp-c") as missing:
        aggregator.aggregate()
    assert missing.value.missing == ("hosp-c",)
    # The survivors' masked vectors alone unmask to nothing useful: hosp-c's masks remain.
    partial = (
        MaskedSubmission.from_bytes(old["hosp-a"]).vector
        + MaskedSubmission.from_bytes(old["hosp-b"]).vector
    )
    fixed = FixedPoint()
    survivors = round_id.restart_without(["hosp-c"])
    assert (survivors.round, survivors.attempt, survivors.participants) == (
        6,
        1,
        ("hosp-a", "hosp-b"),
    )
    truth = clear_weighted_sum(
        [layout.flatten(fronts[h]) for h in ("hosp-a", "hosp-b")], [120, 45], fixed
    )
    assert not np.array_equal(partial, truth)

    # The restart: fresh seeds for the new participant set.
    second = hospital_rounds(survivors, keys, layout)
    # A seed of the first attempt is refused (same job, round and pair: another attempt).
    stale = next(s for s in first["hosp-a"].outgoing() if s.recipient == "hosp-b")
    with pytest.raises(SeedError, match="another attempt"):
        second["hosp-b"].accept(stale)
    exchange(second)
    # A first-attempt submission is refused by the restart's aggregator.
    restart = Aggregator(survivors, layout.length)
    with pytest.raises(SubmissionRejected, match="attempt 0"):
        restart.receive(old["hosp-a"], hospital="hosp-a")
    restart = Aggregator(survivors, layout.length)
    for h in survivors.participants:
        restart.receive(second[h].mask(fronts[h]).to_bytes(), hospital=h)
    result = second["hosp-a"].unmask(restart.aggregate())
    expected = clear_average(survivors, {h: fronts[h] for h in survivors.participants}, fixed)
    for name, tensor in expected.items():
        assert torch.equal(result[name], tensor)


def test_a_hospital_masks_once_per_attempt(keys) -> None:
    round_id = RoundId(JOB, 0, 0, WEIGHTS)
    fronts = random_fronts(NAMES, torch.Generator().manual_seed(1))
    rounds = hospital_rounds(round_id, keys, VectorLayout.of(fronts["hosp-a"]))
    with pytest.raises(SecAggError, match="waiting for"):
        rounds["hosp-b"].mask(fronts["hosp-b"])
    exchange(rounds)
    rounds["hosp-b"].mask(fronts["hosp-b"])
    with pytest.raises(SecAggError, match="already masked"):
        rounds["hosp-b"].mask(fronts["hosp-a"])


def test_layout_refuses_integer_buffers_and_other_shapes() -> None:
    state = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    layout = VectorLayout.of(state)
    assert layout.entries == (("b", (3,)), ("w", (2, 3))) and layout.length == 9
    with pytest.raises(SecAggError, match="num_batches_tracked"):
        VectorLayout.of({**state, "n": torch.zeros((), dtype=torch.int64)})
    with pytest.raises(SecAggError, match="does not match"):
        layout.flatten({"w": torch.zeros(3, 2), "b": torch.zeros(3)})
    assert torch.equal(layout.unflatten(layout.flatten(state))["w"], state["w"])


# -- through Redis -----------------------------------------------------------------------


@pytest.fixture
def relay(redis_url: str) -> Iterator[tuple[RedisChannel, str]]:
    prefix = f"test-secagg-{uuid.uuid4().hex[:10]}"
    channel = RedisChannel(redis_url)
    yield channel, prefix
    channel.close()
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
    finally:
        client.close()


def test_a_round_through_redis_equals_the_clear_average(keys, relay) -> None:
    channel, prefix = relay
    round_id = RoundId(JOB, 9, 0, WEIGHTS)
    fronts = random_fronts(NAMES, torch.Generator().manual_seed(9))
    layout = VectorLayout.of(fronts["hosp-a"])
    rounds = hospital_rounds(round_id, keys, layout)
    # Seeds and the group key cross the relay sealed, like hand-offs.
    for side in rounds.values():
        for secret in side.outgoing():
            stream = f"{prefix}:secagg:{secret.kind}:to:{secret.recipient}:from:{secret.sender}"
            channel.send(stream, secret.blob)
    for me, side in rounds.items():
        for kind, sender in side.expected:
            blob = channel.receive(f"{prefix}:secagg:{kind}:to:{me}:from:{sender}", timeout=5)
            side.accept(SealedSecret(kind, sender, me, blob))
    for name in NAMES:
        channel.send(f"{prefix}:secagg:up:{name}", rounds[name].mask(fronts[name]).to_bytes())
    # The aggregator reads each hospital's stream (only that hospital may write it).
    aggregator = Aggregator(round_id, layout.length)
    for name in NAMES:
        aggregator.receive(channel.receive(f"{prefix}:secagg:up:{name}", timeout=5), hospital=name)
    channel.send(f"{prefix}:secagg:down", aggregator.aggregate().to_bytes())
    aggregate = Aggregate.from_bytes(channel.receive(f"{prefix}:secagg:down", timeout=5))
    expected = clear_average(round_id, fronts, FixedPoint())
    result = rounds["hosp-c"].unmask(aggregate)
    for name, tensor in expected.items():
        assert torch.equal(result[name], tensor)
