"""Attack: a hospital of a SplitFed job sends the worker's aggregator a submission that
is not a masked front of this round: a vector of the wrong length, one made for another
round, one recorded under another hospital's name, or a replay of its own.

Before: nothing on the platform summed fronts (the agents combined hand-offs in the
clear, which SplitFed must not do).

Now: ``workers/aggregation_runner.py`` reads each submission off the relay stream only
that hospital's relay user writes, checks it against the digest the hospital recorded
(``training.aggregation.aggregation_submit``, which refuses a second digest) and against
the round (:class:`medsplit.secagg.Aggregator`). Here the attacker's bytes go through the
real relay and the coordinator's real services and database; the aggregator runs as a
worker runs it. The round fails naming the attacker, no aggregate reaches any stream,
and the job's failure policy applies: ``fail`` fails the job, ``skip`` opens the next
attempt without the attacker.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import redis

from hospitals.relay_acl import relay_keys
from kernel.actors import Actor, ActorKind
from kernel.errors import Conflict
from medsplit.channel.redis import RedisChannel
from medsplit.secagg import MaskedSubmission, RoundId, VectorLayout
from medsplit.training.aggregate_state import aggregation_parts
from medsplit.training.setup import cached_split, client_parties
from training import services
from training.aggregation import aggregation_submit
from training.models import Aggregation, Turn
from training.states import JobState
from workers import aggregation_runner

pytestmark = pytest.mark.django_db


@pytest.fixture
def relay(settings, redis_url: str) -> str:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "WORKER_REDIS_URL": redis_url}
    return redis_url


def open_round(make_job, on_failure: str) -> Aggregation:
    """A SplitFed job whose round 0 turns all completed: its aggregation is open."""
    job = services.job_start(
        job=make_job(
            state="scheduled",
            mode="splitfed",
            mode_options={"variant": "v1", "labels": "server"},
            on_failure=on_failure,
        )
    )
    Turn.objects.filter(job=job).update(status=Turn.Status.COMPLETED)
    assert services.group_start_next(job=job) == []
    return Aggregation.objects.get(job=job)


def length_of(aggregation: Aggregation) -> int:
    config = aggregation.job.training_config()
    split = cached_split(aggregation.job.job_description().job_model(), config.cuts)
    return VectorLayout.of(aggregation_parts(client_parties(split, config))[0]).length


def submit(redis_url: str, aggregation: Aggregation, hospital, vector, **round_fields) -> None:
    """Put ``vector`` on ``hospital``'s stream as its submission, and record it."""
    job = aggregation.job
    rid = RoundId(
        f"job-{job.pk}",
        round_fields.get("round", aggregation.round_index),
        aggregation.attempt,
        aggregation.weights,
    )
    data = MaskedSubmission.for_round(rid, hospital.slug, vector).to_bytes()
    channel = RedisChannel(redis_url)
    try:
        channel.send(relay_keys().streams(f"job-{job.pk}", hospital.slug, "agg").up, data)
    finally:
        channel.close()
    aggregation_submit(
        actor=Actor(ActorKind.HOSPITAL, hospital=hospital),
        job_id=job.pk,
        round_index=aggregation.round_index,
        attempt=aggregation.attempt,
        sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        counts={},
    )


def down_streams_empty(redis_url: str, aggregation: Aggregation, hospitals) -> bool:
    """No aggregate was put on any participant's stream."""
    client = redis.Redis.from_url(redis_url)
    try:
        return all(
            client.xlen(relay_keys().streams(f"job-{aggregation.job_id}", h.slug, "agg").down) == 0
            for h in hospitals
        )
    finally:
        client.close()


def honest(length: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 2**63, size=length, dtype=np.uint64)


def test_a_submission_of_the_wrong_length_fails_the_round_naming_the_hospital(
    make_job, three_hospitals, relay: str
) -> None:
    aggregation = open_round(make_job, on_failure="fail")
    length = length_of(aggregation)
    a, b, attacker = three_hospitals
    submit(relay, aggregation, a, honest(length))
    submit(relay, aggregation, b, honest(length))
    submit(relay, aggregation, attacker, honest(length + 1))

    result = aggregation_runner.run(aggregation.pk)

    assert result.outcome == "refused"
    aggregation.refresh_from_db()
    assert aggregation.status == Aggregation.Status.FAILED
    assert attacker.slug in aggregation.failure_reason
    assert f"{length + 1} values, not {length}" in aggregation.failure_reason
    assert not aggregation.aggregate_sha256, "something was averaged"
    assert down_streams_empty(relay, aggregation, three_hospitals), "an aggregate went out"
    job = aggregation.job
    job.refresh_from_db()
    assert job.state == JobState.FAILED and attacker.slug in job.state_reason


def test_a_submission_made_for_another_round_is_refused_and_skip_leaves_the_sender_out(
    make_job, three_hospitals, relay: str
) -> None:
    aggregation = open_round(make_job, on_failure="skip")
    length = length_of(aggregation)
    a, b, attacker = three_hospitals
    submit(relay, aggregation, a, honest(length))
    submit(relay, aggregation, b, honest(length))
    submit(relay, aggregation, attacker, honest(length), round=5)

    assert aggregation_runner.run(aggregation.pk).outcome == "refused"

    aggregation.refresh_from_db()
    assert aggregation.status == Aggregation.Status.RESTARTED
    assert "it is for round 5" in aggregation.failure_reason
    following = Aggregation.objects.get(job=aggregation.job, attempt=1)
    assert set(following.weights) == {a.slug, b.slug}, "the attacker is left out, fresh seeds"
    assert following.dropped[0]["hospital"] == attacker.slug
    assert down_streams_empty(relay, aggregation, three_hospitals), "an aggregate went out"


def test_a_second_digest_from_one_hospital_is_refused(make_job, three_hospitals, relay) -> None:
    aggregation = open_round(make_job, on_failure="fail")
    length = length_of(aggregation)
    attacker = three_hospitals[2]
    submit(relay, aggregation, attacker, honest(length))
    with pytest.raises(Conflict, match="already submitted"):
        # The same masks over a second vector would give away the difference of the two.
        submit(relay, aggregation, attacker, honest(length) + np.uint64(1))
    aggregation.refresh_from_db()
    assert list(aggregation.submissions) == [attacker.slug]


def test_a_hospital_outside_the_round_cannot_submit(make_job, three_hospitals, relay) -> None:
    aggregation = open_round(make_job, on_failure="fail")
    Aggregation.objects.filter(pk=aggregation.pk).update(
        weights={h.slug: 40 for h in three_hospitals[:2]}
    )
    aggregation.refresh_from_db()
    with pytest.raises(Conflict, match="not a participant"):
        submit(relay, aggregation, three_hospitals[2], honest(length_of(aggregation)))
