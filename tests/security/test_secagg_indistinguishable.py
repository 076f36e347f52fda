"""What the aggregator reads from the relay is indistinguishable from random.

Over many rounds, three hospitals mask their fronts and send them through a real Redis;
the aggregator reads them there. On the vectors it read, two statistics look for what
masking should hide: the correlation of each coordinate with the hospital's true weights,
and a chi-square test that the top 8 bits are uniform. The same statistics run on the
unmasked vectors (masking off) and must detect them, so these tests would fail if the
masks were left out; and on the sum with the pairwise masks alone (no group mask), which
they must detect too: the group mask is what hides the average from the aggregator.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
import torch

from medsplit.channel.redis import RedisChannel
from medsplit.secagg import (
    Aggregator,
    FixedPoint,
    MaskedSubmission,
    RoundId,
    VectorLayout,
    clear_weighted_sum,
)
from tests.secagg_parties import exchange, hospital_rounds, make_keys

JOB = "job-indistinguishable"
NAMES = ["hosp-a", "hosp-b", "hosp-c"]
WEIGHTS = {"hosp-a": 210, "hosp-b": 97, "hosp-c": 403}
ROUNDS = 200
SIZE = 64
# |Z| above 5.5 has probability 3.8e-8 per coordinate; over 64 coordinates, four vectors
# and both statistics a masked run fails by chance about once in 100,000 runs.
THRESHOLD = 5.5
DETECTED = 2 * THRESHOLD
"""What a leak must score: a correlation of 1 scores sqrt(200) = 14.1."""


def correlation_z(truth: np.ndarray, seen: np.ndarray) -> float:
    """The largest |Pearson correlation| over coordinates, times sqrt(rounds): about
    standard normal per coordinate when ``seen`` is independent of ``truth``."""
    x = truth - truth.mean(axis=0)
    y = seen - seen.mean(axis=0)
    corr = (x * y).sum(axis=0) / np.sqrt((x * x).sum(axis=0) * (y * y).sum(axis=0))
    return float(np.abs(corr).max() * math.sqrt(truth.shape[0]))


def top_bits_z(ring: np.ndarray, bits: int = 8) -> float:
    """The chi-square statistic of the top ``bits`` bits against the uniform law, as a
    standard normal score (Wilson–Hilferty)."""
    top = (ring.reshape(-1) >> np.uint64(64 - bits)).astype(np.int64)
    counts = np.bincount(top, minlength=2**bits)
    expected = top.size / 2**bits
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    k = 2**bits - 1
    return ((chi2 / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def signed(ring: np.ndarray) -> np.ndarray:
    """Ring values read as two's complement, scaled to [-1, 1)."""
    return ring.view(np.int64).astype(np.float64) / 2.0**63


@pytest.fixture(scope="module")
def observed(redis_url: str) -> Iterator[dict[str, np.ndarray]]:
    """ROUNDS rounds through Redis: what the aggregator read, and the truth it hides."""
    prefix = f"test-secagg-{uuid.uuid4().hex[:10]}"
    channel = RedisChannel(redis_url)
    keys = make_keys(JOB, NAMES)
    fixed = FixedPoint()
    generator = torch.Generator().manual_seed(2026)
    layout = VectorLayout((("front.weight", (SIZE,)),))
    truth: dict[str, list] = {h: [] for h in NAMES}
    read: dict[str, list] = {h: [] for h in NAMES}
    clear: dict[str, list] = {h: [] for h in NAMES}
    aggregates, sums, pair_only = [], [], []
    try:
        for r in range(ROUNDS):
            round_id = RoundId(JOB, r, 0, WEIGHTS)
            # Weights that vary a lot from round to round, so that any leak shows.
            fronts = {
                h: {"front.weight": torch.randn(SIZE, generator=generator) * 3.0} for h in NAMES
            }
            rounds = hospital_rounds(round_id, keys, layout, fixed)
            exchange(rounds)
            for h in NAMES:
                channel.send(f"{prefix}:secagg:up:{h}", rounds[h].mask(fronts[h]).to_bytes())
            aggregator = Aggregator(round_id, SIZE)
            for h in NAMES:
                data = channel.receive(f"{prefix}:secagg:up:{h}", timeout=5)
                aggregator.receive(data, hospital=h)
                read[h].append(MaskedSubmission.from_bytes(data).vector)
                truth[h].append(fronts[h]["front.weight"].double().numpy())
                clear[h].append(fixed.encode(fronts[h]["front.weight"], WEIGHTS[h], 710))
            aggregates.append(aggregator.aggregate().vector)
            sums.append(sum(WEIGHTS[h] * fronts[h]["front.weight"].double().numpy() for h in NAMES))
            # Without a group mask the pairwise masks cancel, and the aggregator would see
            # the clear weighted sum.
            pair_only.append(
                clear_weighted_sum(
                    [fronts[h]["front.weight"] for h in NAMES], [WEIGHTS[h] for h in NAMES], fixed
                )
            )
    finally:
        channel.close()
        client = redis.Redis.from_url(redis_url)
        try:
            for key in client.scan_iter(match=f"{prefix}:*"):
                client.delete(key)
        finally:
            client.close()
    yield {
        **{f"truth:{h}": np.stack(truth[h]) for h in NAMES},
        **{f"read:{h}": np.stack(read[h]) for h in NAMES},
        **{f"clear:{h}": np.stack(clear[h]) for h in NAMES},
        "aggregates": np.stack(aggregates),
        "sums": np.stack(sums),
        "pair_only": np.stack(pair_only),
    }


# hosp-a leads (it adds the group mask too); hosp-b and hosp-c are hidden by their
# pairwise masks alone.
@pytest.mark.parametrize("hospital", NAMES)
def test_no_coordinate_of_a_submission_correlates_with_the_weights(observed, hospital: str) -> None:
    truth = observed[f"truth:{hospital}"]
    assert correlation_z(truth, signed(observed[f"read:{hospital}"])) < THRESHOLD
    # Masking off: the same statistic sees the weights at once.
    assert correlation_z(truth, signed(observed[f"clear:{hospital}"])) > DETECTED


@pytest.mark.parametrize("hospital", NAMES)
def test_the_top_bits_of_a_submission_are_uniform(observed, hospital: str) -> None:
    assert abs(top_bits_z(observed[f"read:{hospital}"])) < THRESHOLD
    assert top_bits_z(observed[f"clear:{hospital}"]) > DETECTED


def test_the_aggregate_hides_the_average_too(observed) -> None:
    # The aggregate is still group-masked: uncorrelated with the true weighted sum.
    assert correlation_z(observed["sums"], signed(observed["aggregates"])) < THRESHOLD
    assert abs(top_bits_z(observed["aggregates"])) < THRESHOLD
    # Pairwise masks alone cancel in the sum, which the statistics would see.
    assert correlation_z(observed["sums"], signed(observed["pair_only"])) > DETECTED
    assert top_bits_z(observed["pair_only"]) > DETECTED
