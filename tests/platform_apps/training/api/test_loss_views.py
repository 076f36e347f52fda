"""The dashboard's loss curves: ``GET /api/jobs/{id}/loss-series/`` (one curve per hospital
over the job's steps, rounds marked, the steps of each hospital's turn), and the loss a
hospital's agent reports where the loss is computed at the hospital (U-shaped)."""

from __future__ import annotations

import pytest

from tests.platform_apps.training.api.test_views import admin, error, hal
from training import services
from training.models import Job, Turn

__all__ = ["admin", "hal"]

pytestmark = pytest.mark.django_db


def _run_job(job: Job, *, steps: int, rounds: int, loss_of=None) -> Job:
    """Every turn of ``job`` takes ``steps`` steps, a point each step, then completes."""
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    while turn is not None:
        for step in range(1, steps + 1):
            loss = loss_of(turn, step) if loss_of else 1.0 / step
            services.turn_record_progress(
                turn=turn, steps=step, samples=16 * step, bytes_up=step, bytes_down=step,
                loss=loss, final=True,
            )  # fmt: skip
        services.turn_finish(turn=turn, metrics={"val_accuracy": 0.5})
        turn = services.turn_start_next(job=job)
    return job


def test_loss_series_is_one_curve_per_hospital_over_the_jobs_steps(
    admin, hal, make_job, three_hospitals
) -> None:
    job = _run_job(make_job(rounds=2, max_steps_per_turn=4), steps=4, rounds=2)
    body = admin.get(f"/api/jobs/{job.pk}/loss-series/").json()
    assert body["loss_from"] == "server"
    # Three hospitals, four steps each, two rounds: the axis runs to 24, round 2 at 12.
    assert body["total_steps"] == 24
    assert body["rounds"] == [{"round": 0, "start": 0}, {"round": 1, "start": 12}]
    # 40 training samples a hospital, batch 16, the last part batch dropped: 2 steps.
    assert body["turn_steps"] == {h.slug: 2 for h in three_hospitals}
    curves = {c["hospital"]: c["points"] for c in body["series"]}
    assert list(curves) == [h.slug for h in three_hospitals]
    second = curves[three_hospitals[1].slug]
    assert [x for x, _ in second] == [5, 6, 7, 8, 17, 18, 19, 20]
    assert second[0][1] == pytest.approx(1.0) and second[3][1] == pytest.approx(0.25)
    # A hospital admin: their own curve only, on the same axis.
    mine = hal.get(f"/api/jobs/{job.pk}/loss-series/").json()
    assert [c["hospital"] for c in mine["series"]] == [three_hospitals[0].slug]
    assert mine["rounds"] == body["rounds"]
    assert mine["turn_steps"] == {
        h.slug: (2 if i == 0 else None) for i, h in enumerate(three_hospitals)
    }


def test_loss_series_is_thinned_to_a_readable_number_of_points(admin, make_job) -> None:
    from training.selectors import LOSS_SERIES_MAX_POINTS

    job = make_job(rounds=1, max_steps_per_turn=None, local_epochs=1)
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    for step in range(1, LOSS_SERIES_MAX_POINTS + 200):
        services.turn_record_progress(
            turn=turn, steps=step, samples=step, bytes_up=0, bytes_down=0, loss=1.0, final=True
        )
    (curve, *_) = admin.get(f"/api/jobs/{job.pk}/loss-series/").json()["series"]
    assert len(curve["points"]) == LOSS_SERIES_MAX_POINTS
    assert curve["points"][-1][0] == LOSS_SERIES_MAX_POINTS + 199


def test_a_ushaped_agent_reports_its_loss_and_the_dashboard_gets_it(
    admin, agent_client, hospital_a, make_job, three_hospitals
) -> None:
    job = make_job(mode="ushaped", cuts=["pool1", "pool"], rounds=1)
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    assert turn.hospital == hospital_a
    url = f"/api/agent/assignments/{job.pk}/progress/"
    agent = agent_client(hospital_a)
    # The worker has no loss to report in U-shaped mode (None): the hospital's stays.
    services.turn_record_progress(
        turn=turn, steps=1, samples=16, bytes_up=1, bytes_down=1, loss=None, final=True
    )
    answer = agent.post(url, {"turn": turn.pk, "step": 2, "loss": 0.693}, format="json")
    assert answer.status_code == 200, answer.content
    services.turn_record_progress(
        turn=turn, steps=2, samples=32, bytes_up=2, bytes_down=2, loss=None, final=True
    )
    status = admin.get(f"/api/jobs/{job.pk}/status/").json()
    assert status["last_loss"] == pytest.approx(0.693)
    body = admin.get(f"/api/jobs/{job.pk}/loss-series/").json()
    assert body["loss_from"] == "hospital"
    assert body["series"][0]["points"] == [[2, pytest.approx(0.693)]]
    # Only its own turn, only while it runs, a step within the job's limit.
    other = agent_client(three_hospitals[1])
    error(
        other.post(url, {"turn": turn.pk, "step": 2, "loss": 0.5}, format="json"), 404, "not_found"
    )
    too_far = {"turn": turn.pk, "step": 10_000, "loss": 0.5}
    assert "step" in error(agent.post(url, too_far, format="json"), 400, "invalid")
    services.turn_finish(turn=turn, metrics={})
    error(
        agent.post(url, {"turn": turn.pk, "step": 3, "loss": 0.5}, format="json"), 409, "conflict"
    )


def test_a_late_report_of_the_last_step_ends_the_turns_curve(
    admin, agent_client, hospital_a, make_job
) -> None:
    """A short turn may be completed before its hospital's report of the last step
    arrives: the worker's final point at that step takes it, and nothing else does."""
    job = make_job(mode="ushaped", cuts=["pool1", "pool"], rounds=1)
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    url = f"/api/agent/assignments/{job.pk}/progress/"
    agent = agent_client(hospital_a)
    for step in (1, 2):
        services.turn_record_progress(
            turn=turn, steps=step, samples=16 * step, bytes_up=1, bytes_down=1, loss=None,
            final=True,
        )  # fmt: skip
    services.turn_finish(turn=turn, metrics={})
    answer = agent.post(url, {"turn": turn.pk, "step": 2, "loss": 0.25}, format="json")
    assert answer.status_code == 200, answer.content
    body = admin.get(f"/api/jobs/{job.pk}/loss-series/").json()
    assert body["series"][0]["points"] == [[2, pytest.approx(0.25)]]
    assert admin.get(f"/api/jobs/{job.pk}/status/").json()["last_loss"] == pytest.approx(0.25)
    # The point is filled once; a second late report, or one of a step with no point
    # waiting, is refused.
    again = {"turn": turn.pk, "step": 2, "loss": 0.5}
    error(agent.post(url, again, format="json"), 409, "conflict")
    error(agent.post(url, {**again, "step": 3}, format="json"), 409, "conflict")


def test_a_hospitals_loss_is_refused_where_the_server_computes_it(
    agent_client, hospital_a, make_job
) -> None:
    job = make_job(rounds=1)
    Job.objects.filter(pk=job.pk).update(state="scheduled")
    job = services.job_start(job=job)
    turn = services.turn_start_next(job=job)
    url = f"/api/agent/assignments/{job.pk}/progress/"
    body = {"turn": turn.pk, "step": 1, "loss": 0.1}
    error(agent_client(hospital_a).post(url, body, format="json"), 409, "conflict")
    turn.refresh_from_db()
    assert turn.last_loss is None
    assert Turn.objects.get(pk=turn.pk).status == "running"
