"""Unbounded work for anyone signed in, attacked: cut tables at huge input shapes, and
agents' long-polls holding every thread. Against the deployment (nginx, gunicorn's 2
processes with 4 threads each, the shared Redis), except the throttle's rate, in-process.

Before: ``GET /api/models/densenet121/cuts/?input_shape=1,1448,1448`` cost 25 s of CPU and
+0.8 GB on this machine, and 20 long-polls of one agent token held every thread, so that
an anonymous request then waited 28 s.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.test import override_settings

from hospitals.models import Hospital
from tests.platform_apps.conftest import PASSWORD, issue_agent_token
from tests.security.proxy import GUNICORN_WORKERS, LONG_POLLS_PER_PROCESS, Deployment
from tests.security.test_proxy import sign_in
from training.validation import CUT_TABLE_MAX_SIDE, CUT_TABLE_MAX_VALUES

CUTS = "/api/models/{model}/cuts/"
ASSIGNMENTS = "/api/agent/assignments/"
WAIT = 3.0  # seconds each long-poll asks to wait


def test_a_huge_input_shape_is_refused_at_once_naming_the_limit(
    deployment: Deployment, consortium_admin
) -> None:
    person = deployment.client("127.0.0.2")
    assert sign_in(deployment, person, "ada", PASSWORD).status_code == 200
    url = deployment.url + CUTS.format(model="densenet121")
    started = time.monotonic()
    refused = person.get(url, params={"input_shape": "1,1448,1448"}, timeout=30)
    assert time.monotonic() - started < 2.0
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["code"] == "input_too_large"
    assert f"each side at most {CUT_TABLE_MAX_SIDE}" in body["message"]
    assert f"at most {CUT_TABLE_MAX_VALUES} values" in body["message"]
    flat = person.get(url, params={"input_shape": f"1,{CUT_TABLE_MAX_SIDE + 1},4"}, timeout=30)
    assert flat.json()["code"] == "input_too_large"

    # Within the bounds: worked out once, then every process answers from the shared cache.
    small = deployment.url + CUTS.format(model="small_cnn")
    first = person.get(small, params={"input_shape": "1,40,40"}, timeout=60)
    assert first.status_code == 200, first.text
    assert deployment.cache is not None
    cache = redis.Redis.from_url(deployment.cache.url)
    try:
        assert any(b"cut-table:small_cnn:1,40,40" in key for key in cache.scan_iter("*cut-table*"))
    finally:
        cache.close()
    for _ in range(4):
        again = person.get(small, params={"input_shape": "1,40,40"}, timeout=60)
        assert again.json() == first.json()


@pytest.mark.django_db
def test_the_cut_table_is_throttled_per_person(client_for, consortium_admin) -> None:
    from django.conf import settings

    client = client_for(consortium_admin)
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "cut_table": "2/minute"}
    with override_settings(
        REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}
    ):
        for _ in range(2):
            assert client.get(CUTS.format(model="small_cnn")).status_code == 200
        throttled = client.get(CUTS.format(model="small_cnn"))
    assert throttled.status_code == 429 and "Retry-After" in throttled


def _etag(deployment: Deployment, token: str) -> str:
    answer = deployment.client().get(
        deployment.url + ASSIGNMENTS, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer.headers["ETag"]


def _long_poll(deployment: Deployment, token: str, etag: str) -> tuple[int, float, str]:
    started = time.monotonic()
    answer = deployment.client().get(
        deployment.url + ASSIGNMENTS,
        params={"wait": f"{WAIT:g}", "etag": etag},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    return answer.status_code, time.monotonic() - started, answer.headers.get("ETag", "")


def test_one_agent_token_holds_one_waiting_long_poll(
    deployment: Deployment, hospital_a: Hospital
) -> None:
    token = issue_agent_token(hospital_a)
    etag = _etag(deployment, token)
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: _long_poll(deployment, token, etag), range(20)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] + [429] * 19, statuses
    assert all(took < WAIT / 2 for status, took, _ in answers if status == 429)
    held = next(took for status, took, _ in answers if status == 200)
    assert held >= WAIT - 0.5  # the one allowed did wait


def test_long_polls_leave_threads_for_people(
    deployment: Deployment, hospital_a: Hospital, consortium_admin
) -> None:
    agents = 12  # more than the 2 x 4 threads of the deployment
    tokens = [issue_agent_token(hospital_a) for _ in range(agents)]
    etags = [_etag(deployment, token) for token in tokens]
    person = deployment.client("127.0.0.3")
    assert sign_in(deployment, person, "ada", PASSWORD).status_code == 200

    with ThreadPoolExecutor(agents) as pool:
        polls = [
            pool.submit(_long_poll, deployment, t, e) for t, e in zip(tokens, etags, strict=True)
        ]
        time.sleep(1.0)  # they are all in
        started = time.monotonic()
        anonymous = deployment.client("127.0.0.4").get(deployment.url + "/api/auth/me/")
        jobs = person.get(deployment.url + "/api/jobs/", timeout=30)
        people_took = time.monotonic() - started
        answers = [poll.result() for poll in polls]

    assert anonymous.status_code in (401, 403) and jobs.status_code == 200
    assert people_took < 2.0, f"people waited {people_took:.1f} s for a thread"
    assert all(status == 200 for status, _, _ in answers)
    held = [took for _, took, _ in answers if took >= WAIT - 0.5]
    at_once = [took for _, took, _ in answers if took < WAIT - 0.5]
    assert 1 <= len(held) <= LONG_POLLS_PER_PROCESS * GUNICORN_WORKERS, answers
    assert len(at_once) >= agents - LONG_POLLS_PER_PROCESS * GUNICORN_WORKERS
    # Answered at once as "no change": the ETag each agent already had.
    assert [tag for _, _, tag in answers] == etags
