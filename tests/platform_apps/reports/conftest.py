"""A finished job, made directly in the database (no training): the result document's
tests read it. Hospitals A (st-marys), B (city-general) and C (northside) took two rounds
of turns with distinct figures each, handed their weights on, and the job completed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from kernel.actors import Actor
from tests.platform_apps.training.conftest import hospital_c, job_data, make_job, three_hospitals
from training import services
from training.evaluation import evaluation_finish, evaluation_start
from training.models import HandOff, Job, MetricPoint, Round, Turn

__all__ = [
    "hospital_c",
    "job_data",
    "make_job",
    "three_hospitals",
]


@dataclass(frozen=True)
class Figures:
    """One hospital's figures in the finished job: each distinct, so that a document that
    shows one of them shows that hospital's part."""

    loss: float
    accuracy: float
    bytes_up: int
    bytes_down: int
    handoff_bytes: int
    #: Its final model's evaluation on its test set (None: it holds no test set).
    test: dict[str, float] | None = None


#: By slug. Only A's and the consortium's readers may see A's; and so on.
FIGURES = {
    "st-marys": Figures(
        0.2345671, 0.9123457, 5555551, 4444441, 777771,
        test={"accuracy": 0.8712347, "auc": 0.9234567, "baseline_accuracy": 0.6251237,
              "samples": 64},
    ),
    "city-general": Figures(
        0.8123457, 0.6543217, 9876543, 8765431, 666661,
        test={"accuracy": 0.7123457, "auc": 0.8345671, "baseline_accuracy": 0.5812347,
              "samples": 48},
    ),
    "northside": Figures(0.5432167, 0.7345617, 3333331, 2222221, 555551),
}  # fmt: skip


@pytest.fixture
def finished_job(make_job, three_hospitals) -> Job:
    """A completed two-round vanilla job of A, B and C, its final model evaluated at A
    and B (C holds no test set), as the services record it (see :data:`FIGURES`)."""
    for hospital in three_hospitals:
        test = FIGURES[hospital.slug].test
        hospital.dataset_summary["split_sizes"]["test"] = test["samples"] if test else 0
        hospital.save(update_fields=["dataset_summary"])
    job = make_job("running", name="pneumonia screening")
    start = timezone.now() - timedelta(minutes=30)
    Job.objects.filter(pk=job.pk).update(started_at=start)
    for index in range(2):
        round_ = Round.objects.create(
            job=job, index=index, status=Round.Status.COMPLETED,
            started_at=start + timedelta(minutes=10 * index),
        )  # fmt: skip
        for position, hospital in enumerate(three_hospitals):
            f = FIGURES[hospital.slug]
            at = start + timedelta(minutes=10 * index + 3 * position)
            turn = Turn.objects.create(
                job=job, round=round_, hospital=hospital, position=position, group=position,
                status=Turn.Status.COMPLETED, started_at=at, finished_at=at + timedelta(minutes=2),
                steps=3, samples=40, bytes_up=f.bytes_up, bytes_down=f.bytes_down,
                last_loss=f.loss,
                metrics={"val_accuracy": f.accuracy, "val_loss": f.loss, "train_loss": f.loss},
            )  # fmt: skip
            for step in (1, 2, 3):  # the steps done, as the worker reports them
                MetricPoint.objects.create(
                    job=job, turn=turn, step=step, time=at + timedelta(seconds=step),
                    loss=f.loss + 0.1 * (3 - step), samples=16 * step,
                    bytes_up=f.bytes_up, bytes_down=f.bytes_down,
                )  # fmt: skip
            recipient = three_hospitals[(position + 1) % 3]
            HandOff.objects.create(
                job=job, turn=turn, sender=hospital, recipient=recipient,
                ciphertext_sha256=f"{index}{position}".ljust(64, "a"),
                size_bytes=f.handoff_bytes, created_at=at,
            )  # fmt: skip
    job = services.job_transition(job=job, to="completed", actor=Actor.system())
    evaluation = evaluation_start(job=job, actor=Actor.system())
    for part in evaluation.parts.select_related("hospital", "job", "evaluation"):
        test = FIGURES[part.hospital.slug].test
        if test is not None:
            evaluation_finish(
                part=part, metrics=test, bytes_up=1000 + part.position, bytes_down=2000
            )
    job.refresh_from_db()
    return job
