"""A job with the privacy audit on, with real processes: the coordinator (a live server),
the real Redis with the hospital's user, a Celery worker and beat, and one agent process
on synthetic images.

U-shaped, so the labels stay at the hospital: after its turn the agent audits the job's
trained front on its own data and reports the numbers; the coordinator ends up with the
hospital's figures of the round (inversion SSIM and PSNR, distance correlation, the
label-leakage attacks' AUCs), and the picture grid is in the agent's work directory only.
"""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest
from django.apps import apps
from django.core import serializers as django_serializers

from audit.models import AuditEvent
from tests.workers.agents import Agents, consortium, small_job, wait_completed
from tests.workers.processes import Processes, processes, wait_until, workers_relay_user
from training.models import PrivacyFigures
from training.selectors import privacy_figures

__all__ = ["consortium", "processes"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PNG = b"\x89PNG\r\n\x1a\n"


def test_an_audited_job_ends_with_the_hospitals_figures_and_the_picture_at_home(
    processes: Processes, consortium: str, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    agents = Agents(processes, consortium, tmp_path).enrol(admin_actor, 1)
    with workers_relay_user(redis_url, processes):
        processes.celery_worker("worker")
        processes.celery_beat()
        job = small_job(
            admin_actor,
            agents.hospitals,
            mode="ushaped",
            cuts=["pool1", "pool"],
            max_steps_per_turn=4,
            privacy={"audit": {"every_rounds": 1, "decoder_steps": 5, "records": 16}},
        )
        wait_completed(processes, job, agents, 300)
        # The audit follows the turn, so it may land just after the job completed.
        wait_until(
            "the hospital's privacy figures",
            lambda: PrivacyFigures.objects.filter(job=job).exists(),
            60,
            processes,
        )

    (figures,) = privacy_figures(job, admin_actor)
    assert (figures["round"], figures["hospital"]) == (0, agents.hospitals[0].slug)
    assert -1.0 <= figures["ssim"] <= 1.0 and 0.0 < figures["psnr"] <= 200.0
    assert 0.0 <= figures["distance_correlation"] <= 1.0
    # At most `records` of each split: 134 training records, 16 kept for validation.
    assert figures["train_records"] == 16 and figures["val_records"] == 16
    # The labels stay at the hospital: it scored the gradients it sent up, every step's.
    assert figures["label_records"] == 4 * 16
    assert 0.0 <= figures["norm_auc"] <= 1.0 and 0.0 <= figures["cosine_auc"] <= 1.0
    assert figures["epsilon"] is None  # no activation noise in this job

    # The picture is at home, for the agent's user only; only numbers left.
    folder = tmp_path / "agent-0" / "privacy" / f"job-{job.pk}"
    picture = folder / "round-0.png"
    assert picture.read_bytes().startswith(PNG)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (event,) = AuditEvent.objects.filter(job_id=job.pk, action="privacy.reported")
    assert all(isinstance(v, int | float) or v is None for v in event.details["figures"].values())
    tables = io.StringIO()
    for model in apps.get_models():
        tables.write(django_serializers.serialize("json", model.objects.all()))
    # The signature as JSON writes it, and base64's (random keys may hold "PNG" by chance).
    dumped = tables.getvalue()
    assert json.dumps(PNG.decode("latin-1"))[1:-1] not in dumped and "iVBORw0KGgo" not in dumped
