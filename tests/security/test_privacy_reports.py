"""Privacy figures against hostile participants, through the coordinator's real API.

A hospital's agent could report figures for another hospital or for a job it takes no
part in, report numbers that are not figures (infinite, out of range, strings), smuggle
something besides numbers (a picture) into a report, or report a round twice to rewrite
it; a hospital admin could read another hospital's figures. Each is refused, and nothing
of it is stored.
"""

from __future__ import annotations

import base64
import json

import pytest

from hospitals.models import Hospital
from kernel.actors import Role
from tests.platform_apps.conftest import make_hospital, make_person
from training import services
from training.models import PrivacyFigures

pytestmark = pytest.mark.django_db

PRIVACY = {
    "audit": {"every_rounds": 1, "decoder_steps": 20, "records": 64},
    "activation_noise": {"clip_norm": 1.0, "target_epsilon": 8.0, "delta": 1e-5},
}
HONEST = {
    "round": 0,
    "ssim": 0.42,
    "psnr": 17.5,
    "baseline_ssim": 0.2,
    "baseline_psnr": 12.25,
    "distance_correlation": 0.61,
    "train_records": 40,
    "val_records": 10,
    "epsilon": 1.5,
    "delta_total": 2e-5,
    "noise_multiplier": 1.1,
}


@pytest.fixture
def job(make_job):
    return services.job_start(job=make_job(state="scheduled", privacy=PRIVACY))


def _epsilon(value: str) -> str:
    """A report of ε alone, the group's other figures honest, ε as given."""
    return f'{{"round": 0, "epsilon": {value}, "delta_total": 2e-5, "noise_multiplier": 1.1}}'


def _post(client, job_id: int, body: object, *, raw: str | None = None):
    return client.post(
        f"/api/agent/assignments/{job_id}/privacy/",
        data=raw if raw is not None else json.dumps(body),
        content_type="application/json",
    )


def test_a_hospital_reports_only_for_itself_and_its_own_jobs(
    job, three_hospitals, agent_client, make_job
) -> None:
    a, b, _ = three_hospitals
    agent = agent_client(a)
    # Naming another hospital: no such field; the figures are always the caller's own.
    refused = _post(agent, job.pk, {**HONEST, "hospital": b.slug})
    assert refused.status_code == 400 and refused.json()["details"]["hospital"] == ["unknown field"]
    outsider = make_hospital("outsider")
    assert _post(agent_client(outsider), job.pk, HONEST).status_code == 404
    # A job it is in, a round it took no turn in (round 1 has not started).
    late = _post(agent, job.pk, {**HONEST, "round": 1})
    assert late.status_code == 400 and "no turn of yours" in late.text
    assert not PrivacyFigures.objects.exists()
    assert _post(agent, job.pk, HONEST).status_code == 200
    (row,) = PrivacyFigures.objects.all()
    assert row.hospital == a and row.ssim == 0.42 and row.epsilon == 1.5


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (_epsilon("1e999"), "epsilon"),  # json reads it as inf
        (_epsilon("NaN"), None),  # not JSON: refused by the parser
        (_epsilon("-1.0"), "epsilon"),
        (_epsilon('"1.5"'), "epsilon"),
        (_epsilon("true"), "epsilon"),
        (json.dumps({**HONEST, "ssim": 1.5}), "ssim"),
        ('{"round": 0, "ssim": 0.5}', "psnr"),  # the audit's figures in part
        ('{"round": 0, "norm_auc": 0.5}', "norm_auc"),  # labels at the server: not measured
    ],
    ids=[
        "infinite",
        "nan",
        "negative",
        "string",
        "boolean",
        "ssim-range",
        "in-part",
        "not-measured",
    ],
)
def test_numbers_that_are_not_figures_are_refused(
    job, three_hospitals, agent_client, raw: str, field: str | None
) -> None:
    response = _post(agent_client(three_hospitals[0]), job.pk, None, raw=raw)
    assert response.status_code == 400, response.text
    if field is not None:
        assert field in response.json()["details"]
    assert not PrivacyFigures.objects.exists()


def test_a_picture_smuggled_into_a_report_is_refused(job, three_hospitals, agent_client) -> None:
    agent = agent_client(three_hospitals[0])
    picture = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(200)).decode()
    refused = _post(agent, job.pk, {**HONEST, "picture": picture})
    assert refused.status_code == 400 and refused.json()["details"]["picture"] == ["unknown field"]
    # Inside a known field: not a number.
    assert _post(agent, job.pk, {**HONEST, "ssim": picture}).status_code == 400
    # Or as a body too large for a few numbers, whatever it holds.
    padded = json.dumps(HONEST)[:-1] + "," + " " * 5000 + "}"
    big = _post(agent, job.pk, None, raw=padded)
    assert big.status_code == 400 and "at most 4096 bytes" in big.text
    assert not PrivacyFigures.objects.exists()


def test_a_round_is_reported_once(job, three_hospitals, agent_client) -> None:
    agent = agent_client(three_hospitals[0])
    assert _post(agent, job.pk, HONEST).status_code == 200
    assert _post(agent, job.pk, HONEST).status_code == 200  # a retry: the same answer
    rewritten = _post(agent, job.pk, {**HONEST, "ssim": 0.01})
    assert rewritten.status_code == 409, rewritten.text
    assert PrivacyFigures.objects.get().ssim == 0.42


def test_a_hospital_admin_reads_only_their_own_hospitals_figures(
    job, three_hospitals, agent_client, client_for, hospital_admin, consortium_admin
) -> None:
    a, b, c = three_hospitals
    for hospital in (a, b):
        assert _post(agent_client(hospital), job.pk, HONEST).status_code == 200
    url = f"/api/jobs/{job.pk}/privacy/"
    seen = client_for(hospital_admin).get(url).json()  # hospital_a's admin
    assert [r["hospital"] for r in seen] == [a.slug]
    assert seen[0]["target_epsilon"] == 8.0 and seen[0]["delta"] == 1e-5
    of_c = make_person("carol", Role.HOSPITAL_ADMIN, Hospital.objects.get(pk=c.pk))
    assert client_for(of_c).get(url).json() == []  # in the job, nothing reported yet
    stranger = make_person("sam", Role.HOSPITAL_ADMIN, make_hospital("elsewhere"))
    assert client_for(stranger).get(url).status_code == 404
    everyone = client_for(consortium_admin).get(url).json()
    assert sorted(r["hospital"] for r in everyone) == sorted([a.slug, b.slug])
    # An agent reads no job's figures, not even its own.
    assert agent_client(a).get(url).status_code == 403
