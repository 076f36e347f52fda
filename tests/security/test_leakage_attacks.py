"""The label-leakage audit against a hostile party.

A passive party could send the label party scores that do not fit the round (to make its
leakage look smaller, or to crash the audit); another participant could report AUCs to
the coordinator as if it held the labels, or report values that are not AUCs. Each is
refused with its reason, and nothing is stored.
"""

from __future__ import annotations

import struct

import pytest
import torch

from hospital_agent.leakage import MAGIC, LeakageScoresRefused, RoundScores
from kernel.errors import InvalidInput, PermissionDenied
from tests.platform_apps.conftest import agent_actor
from training import services
from training.leakage import leakage_report, leakage_summary
from training.models import LabelLeakage

RECORDS = {0: 4, 1: 4}


def _honest() -> RoundScores:
    scores = RoundScores(3)
    for step in RECORDS:
        scores.saw(step, torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))
    return scores


def test_honest_scores_read_back_exactly() -> None:
    scores = _honest()
    back = RoundScores.from_bytes(scores.to_bytes(), round_=3, records=RECORDS)
    for step, (norm, cosine) in scores.steps.items():
        assert torch.equal(back.steps[step][0], norm) and torch.equal(back.steps[step][1], cosine)


@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        (lambda b: b.replace(MAGIC, b"XXXXXXX", 1), "not a label-leakage scores blob"),
        (lambda b: b[: len(MAGIC)] + struct.pack(">I", 4) + b[len(MAGIC) + 4 :], "round 4"),
        (lambda b: b[:-8], "bytes past|truncated|scores for its"),
        (lambda b: b + b"\0", "1 bytes past the scores' end"),
    ],
    ids=["not-scores", "another-round", "truncated", "trailing"],
)
def test_scores_that_do_not_fit_the_round_are_refused(tamper, refusal: str) -> None:
    with pytest.raises(LeakageScoresRefused, match=refusal):
        RoundScores.from_bytes(tamper(_honest().to_bytes()), round_=3, records=RECORDS)


def test_scores_of_other_records_or_not_finite_are_refused() -> None:
    with pytest.raises(LeakageScoresRefused, match="4 scores for its 5 records"):
        RoundScores.from_bytes(_honest().to_bytes(), round_=3, records={0: 5, 1: 4})
    with pytest.raises(LeakageScoresRefused, match="not a step of the round"):
        RoundScores.from_bytes(_honest().to_bytes(), round_=3, records={0: 4, 2: 4})
    bad = _honest()
    bad.steps[1] = (torch.tensor([1.0, float("nan"), 0.0, 0.0]), bad.steps[1][1])
    with pytest.raises(LeakageScoresRefused, match="not finite"):
        RoundScores.from_bytes(bad.to_bytes(), round_=3, records=RECORDS)


@pytest.mark.django_db
def test_only_the_label_party_reports_and_only_aucs(make_job, three_hospitals) -> None:
    label, passive, other = three_hospitals
    job = services.job_start(
        job=make_job(state="scheduled", mode="vertical", cuts=["pool1", "pool"])
    )
    entry = {"records": 48, "norm_auc": 0.71, "cosine_auc": 0.4}
    with pytest.raises(PermissionDenied, match="only the job's label party"):
        leakage_report(actor=agent_actor(passive), job_id=job.pk, round_index=0, parties={})
    for parties, refusal in [
        ({label.slug: entry}, "the job's passive parties"),
        ({passive.slug: {**entry, "norm_auc": 1.5}}, r"norm_auc must be in \[0, 1\]"),
        ({passive.slug: {**entry, "labels": [0, 1]}}, "nothing else"),
        ({passive.slug: {**entry, "records": 0}}, "records must be a positive integer"),
    ]:
        with pytest.raises(InvalidInput, match=refusal):
            leakage_report(actor=agent_actor(label), job_id=job.pk, round_index=0, parties=parties)
    with pytest.raises(InvalidInput, match="round must be one of the job's rounds"):
        leakage_report(
            actor=agent_actor(label), job_id=job.pk, round_index=9, parties={passive.slug: entry}
        )
    assert not LabelLeakage.objects.exists()
    leakage_report(
        actor=agent_actor(label),
        job_id=job.pk,
        round_index=0,
        parties={passive.slug: entry, other.slug: {**entry, "cosine_auc": None}},
    )
    assert leakage_summary(job) == [
        {"round": 0, "hospital": passive.slug, "records": 48, "norm_auc": 0.71, "cosine_auc": 0.4},
        {"round": 0, "hospital": other.slug, "records": 48, "norm_auc": 0.71, "cosine_auc": None},
    ]
