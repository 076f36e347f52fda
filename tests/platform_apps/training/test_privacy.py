"""A job's privacy options through POST /api/jobs/, and its privacy figures: what a
report may hold in each mode, and who reads them (the selector the result document uses)."""

from __future__ import annotations

import pytest

from kernel.errors import InvalidInput
from tests.platform_apps.conftest import agent_actor
from training import services
from training.privacy import privacy_report
from training.selectors import privacy_figures

pytestmark = pytest.mark.django_db

AUDIT = {
    "ssim": 0.5,
    "psnr": 18.0,
    "baseline_ssim": 0.3,
    "baseline_psnr": 13.0,
    "distance_correlation": 0.7,
    "train_records": 40,
    "val_records": 10,
}
LEAKAGE = {"label_records": 40, "norm_auc": 0.9, "cosine_auc": None}


def test_the_privacy_option_is_taken_and_its_problems_named_by_field(
    client_for, consortium_admin, job_data
) -> None:
    api = client_for(consortium_admin)
    privacy = {"audit": {"every_rounds": 2}, "nopeek": {"weight": 0.5}}
    created = api.post("/api/jobs/", job_data(privacy=privacy), format="json")
    assert created.status_code == 201, created.json()
    served = api.get(f"/api/jobs/{created.json()['id']}/").json()["description"]["privacy"]
    assert served == {
        "audit": {"every_rounds": 2, "decoder_steps": 300, "records": 1024},
        "nopeek": {"weight": 0.5},
    }
    # Vanilla: the labels travel, so gradient noise has nothing to protect.
    refused = api.post(
        "/api/jobs/", job_data(privacy={"gradient_noise": {"scale": 0.5}}), format="json"
    )
    assert refused.status_code == 400
    assert "labels" in " ".join(refused.json()["details"]["privacy"])


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"method": "splitguard", "probe_probability": 0}, "probe_probability"),
        ({"method": "splitguard", "probe_probability": 1.5}, "probe_probability"),
        ({"method": "splitguard", "probe_probability": "often"}, "probe_probability"),
        ({"method": "splitguard", "min_probes": 0}, "min_probes"),
        ({"method": "splitguard", "threshold": -1}, "threshold"),
        ({"method": "splitout", "window": 0}, "window"),
        ({"method": "splitout", "honest_records": 2}, "honest_records"),
        ({"method": "splitgaurd"}, "method"),
    ],
)
def test_nonsense_hijack_detection_settings_are_refused_naming_the_setting(
    client_for, consortium_admin, job_data, options: dict, named: str
) -> None:
    api = client_for(consortium_admin)
    refused = api.post("/api/jobs/", job_data(privacy={"hijack_detection": options}), format="json")
    assert refused.status_code == 400, refused.json()
    body = refused.json()
    assert list(body["details"]) == ["privacy"]
    (reason,) = body["details"]["privacy"]
    assert reason.startswith(f"hijack_detection.{named} must be ")
    assert repr(options[named]) in reason  # the value sent, quoted back
    assert not api.get("/api/jobs/").json()["results"]  # nothing was stored


def test_where_labels_stay_home_the_leakage_aucs_are_reported_and_everyone_reads_them(
    make_job, three_hospitals, observer_actor, admin_actor
) -> None:
    a = three_hospitals[0]
    job = services.job_start(
        job=make_job(
            state="scheduled",
            mode="ushaped",
            cuts=["pool1", "pool"],
            privacy={"audit": {"every_rounds": 1}},
        )
    )
    with pytest.raises(InvalidInput, match="epsilon"):  # no activation noise in this job
        privacy_report(
            actor=agent_actor(a), job_id=job.pk, round_index=0, figures={**AUDIT, "epsilon": 1.0}
        )
    privacy_report(actor=agent_actor(a), job_id=job.pk, round_index=0, figures={**AUDIT, **LEAKAGE})
    (row,) = privacy_figures(job, observer_actor)
    assert privacy_figures(job, admin_actor) == [row]
    assert (row["hospital"], row["norm_auc"], row["cosine_auc"], row["ssim"]) == (
        a.slug,
        0.9,
        None,
        0.5,
    )
    assert row["epsilon"] is None and row["target_epsilon"] is None
