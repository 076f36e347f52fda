"""``GET /metrics``: who may read it, and that what it says is what the database and the
broker hold (real PostgreSQL or SQLite, real Redis, Prometheus' own parser)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from hospitals.models import Hospital
from monitoring.collectors import STEPS_RATE_WINDOW_SECONDS
from tests.platform_apps.conftest import issue_agent_token, make_hospital
from tests.platform_apps.training.conftest import hospital_c, job_data, make_job, three_hospitals
from tests.redis_server import redis_url
from training.models import MetricPoint, Round, Turn
from training.states import JobState

__all__ = ["hospital_c", "job_data", "make_job", "redis_url", "three_hospitals"]

TOKEN = "metrics-" + "x" * 40
URL = "/metrics"


@pytest.fixture
def token(settings) -> str:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "METRICS_TOKEN": TOKEN}
    return TOKEN


@pytest.fixture
def broker(settings, redis_url: str):
    """The real Redis as the broker, with a queue name of this test's own; its lists are
    under kombu's global_keyprefix (the deployment's), as Celery's are."""
    queue = f"celery.metrics-test-{uuid.uuid4().hex[:8]}"
    settings.CELERY_BROKER_URL = redis_url
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    client = redis.Redis.from_url(redis_url)
    try:
        yield client, queue, prefix
    finally:
        client.delete(queue)
        for key in client.scan_iter(match=f"{prefix}{queue}*"):
            client.delete(key)
        client.close()


def scraper(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def scrape(client: APIClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a successful scrape, by name and labels."""
    response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# -- who may read it ----------------------------------------------------------------------


@pytest.mark.django_db
def test_nobody_signed_in_and_no_token_gets_401_in_the_error_shape(token: str) -> None:
    response = APIClient().get(URL)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert set(response.json()) == {"code", "message", "details"}
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
def test_a_wrong_token_is_refused_clearly(token: str) -> None:
    for wrong in (TOKEN[:-1], TOKEN + "y", "", "a b"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {wrong}".rstrip())
        response = client.get(URL)
        assert response.status_code == 401, wrong
        assert response.json()["code"] == "authentication_failed"


@pytest.mark.django_db
def test_the_wrong_token_message_says_what_is_wrong(token: str) -> None:
    response = scraper("not-the-token").get(URL)
    assert response.json() == {
        "code": "authentication_failed",
        "message": "invalid metrics token",
        "details": {},
    }


@pytest.mark.django_db
def test_an_agent_token_is_not_a_metrics_token(token: str, hospital_a: Hospital) -> None:
    response = scraper(issue_agent_token(hospital_a)).get(URL)
    assert response.status_code == 401


@pytest.mark.django_db
def test_a_token_when_none_is_configured_says_so(settings) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "METRICS_TOKEN": ""}
    response = scraper("anything").get(URL)
    assert response.status_code == 401
    assert "MEDSPLIT_METRICS_TOKEN is not set" in response.json()["message"]
    assert APIClient().get(URL).status_code == 401


@pytest.mark.django_db
def test_the_right_token_reads_the_metrics(token: str, broker) -> None:
    samples = scrape(scraper(token))
    assert value(samples, "medsplit_broker_up") == 1


@pytest.mark.django_db
def test_a_consortium_admin_session_reads_them_without_a_token(
    settings, broker, consortium_admin, client_for
) -> None:
    settings.MEDSPLIT = {**settings.MEDSPLIT, "METRICS_TOKEN": ""}
    samples = scrape(client_for(consortium_admin))
    assert ("medsplit_jobs", (("state", "draft"),)) in samples


@pytest.mark.django_db
def test_other_people_are_refused_with_403(
    token: str, observer, hospital_admin, no_role_person, client_for
) -> None:
    for person in (observer, hospital_admin, no_role_person):
        response = client_for(person).get(URL)
        assert response.status_code == 403, person
        assert response.json()["code"] == "permission_denied"


@pytest.mark.django_db
def test_errors_stay_json_whatever_the_scraper_accepts(token: str) -> None:
    response = APIClient().get(URL, HTTP_ACCEPT="text/plain;version=0.0.4")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


@pytest.mark.django_db
def test_only_get(token: str) -> None:
    response = scraper(token).post(URL)
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


# -- what it says -------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_state_is_there_even_at_zero(token: str, broker) -> None:
    samples = scrape(scraper(token))
    for state in JobState.values:
        assert value(samples, "medsplit_jobs", state=state) == 0
    for status in Turn.Status.values:
        assert value(samples, "medsplit_turns", status=status) == 0
    for presence in ("online", "offline", "not_enrolled"):
        assert value(samples, "medsplit_hospitals", state=presence) == 0
    for status in Hospital.Status.values:
        assert value(samples, "medsplit_hospitals_by_status", status=status) == 0
    assert value(samples, "medsplit_turn_steps_total") == 0
    assert value(samples, "medsplit_cut_bytes_total", direction="up") == 0
    assert value(samples, "medsplit_steps_per_second") == 0


def add_turn(job, hospital: Hospital, status: str, steps: int, up: int, down: int) -> Turn:
    round_ = Round.objects.get_or_create(job=job, index=0, defaults={"started_at": timezone.now()})[
        0
    ]
    position = Turn.objects.filter(round=round_).count()
    return Turn.objects.create(
        job=job,
        round=round_,
        hospital=hospital,
        position=position,
        status=status,
        steps=steps,
        samples=steps * 16,
        bytes_up=up,
        bytes_down=down,
    )


@pytest.mark.django_db
def test_the_values_are_the_databases(
    token: str, broker, make_job, three_hospitals, settings
) -> None:
    a, b, _ = three_hospitals
    now = timezone.now()
    offline_after = settings.MEDSPLIT["HOSPITAL_OFFLINE_AFTER_SECONDS"]
    Hospital.objects.filter(pk=a.pk).update(last_seen_at=now)
    Hospital.objects.filter(pk=b.pk).update(last_seen_at=now - timedelta(seconds=offline_after + 5))
    make_hospital("asked-to-join", status=Hospital.Status.REQUESTED)
    make_hospital("gone-away", status=Hospital.Status.SUSPENDED, last_seen_at=now)

    running = make_job(JobState.RUNNING)
    make_job(JobState.RUNNING)
    done = make_job(JobState.COMPLETED)
    make_job(JobState.DRAFT)
    add_turn(done, a, Turn.Status.COMPLETED, steps=20, up=1000, down=900)
    add_turn(done, b, Turn.Status.FAILED, steps=5, up=300, down=200)
    turn = add_turn(running, a, Turn.Status.RUNNING, steps=12, up=700, down=600)
    add_turn(running, b, Turn.Status.PENDING, steps=0, up=0, down=0)
    # 12 steps in the window (from step 0 to step 12), and an older point outside it.
    window = STEPS_RATE_WINDOW_SECONDS
    for step, ago in ((0, window + 30), (0, window - 20), (6, 10), (12, 1)):
        MetricPoint.objects.create(
            job=running, turn=turn, step=step, time=now - timedelta(seconds=ago)
        )

    samples = scrape(scraper(token))

    jobs = {s: value(samples, "medsplit_jobs", state=s) for s in JobState.values}
    assert jobs == {s: 0 for s in JobState.values} | {"running": 2, "completed": 1, "draft": 1}
    turns = {s: value(samples, "medsplit_turns", status=s) for s in Turn.Status.values}
    assert turns == {"pending": 1, "running": 1, "completed": 1, "failed": 1, "skipped": 0}
    assert value(samples, "medsplit_turn_steps_total") == 37
    assert value(samples, "medsplit_turn_samples_total") == 37 * 16
    assert value(samples, "medsplit_cut_bytes_total", direction="up") == 2000
    assert value(samples, "medsplit_cut_bytes_total", direction="down") == 1700
    assert value(samples, "medsplit_steps_per_second") == pytest.approx(12 / window)
    # c is enrolled and never heard from; the suspended one does not count as online.
    presence = {p: value(samples, "medsplit_hospitals", state=p) for p in ("online", "offline")}
    assert presence == {"online": 1, "offline": 2}
    assert value(samples, "medsplit_hospitals", state="not_enrolled") == 2
    assert value(samples, "medsplit_hospitals_by_status", status="enrolled") == 3
    assert value(samples, "medsplit_hospitals_by_status", status="requested") == 1
    assert value(samples, "medsplit_hospitals_by_status", status="suspended") == 1


@pytest.mark.django_db
def test_a_scrape_is_a_few_aggregate_queries(
    token: str, broker, make_job, three_hospitals, django_assert_num_queries
) -> None:
    for state in (JobState.RUNNING, JobState.COMPLETED, JobState.DRAFT):
        job = make_job(state)
        for hospital in three_hospitals:
            add_turn(job, hospital, Turn.Status.COMPLETED, steps=3, up=10, down=10)
    client = scraper(token)
    # Jobs, turns (counts and sums), steps in the window, hospitals: however many rows.
    with django_assert_num_queries(4):
        scrape(client)


@pytest.mark.django_db
def test_the_queue_length_is_the_brokers(token: str, broker) -> None:
    client, queue, prefix = broker
    client.rpush(prefix + queue, "task-1", "task-2", "task-3")
    client.rpush(f"{prefix}{queue}\x06\x169", "urgent")  # kombu's list for priority step 9
    client.rpush(queue, "not-this-deployments")  # the same queue name without the prefix
    samples = scrape(scraper(token))
    assert value(samples, "medsplit_celery_queue_length", queue=queue) == 4
    client.lpop(prefix + queue)
    assert value(scrape(scraper(token)), "medsplit_celery_queue_length", queue=queue) == 3


@pytest.mark.django_db
def test_every_routed_queue_is_measured(token: str, broker, settings) -> None:
    client, queue, prefix = broker
    turns = f"{queue}-turns"
    settings.CELERY_TASK_ROUTES = {
        "medsplit.run_turn": {"queue": turns},
        "medsplit.sweep": {"queue": queue},  # the default one again: reported once
    }
    client.rpush(prefix + turns, "turn-1", "turn-2")
    samples = scrape(scraper(token))
    assert value(samples, "medsplit_celery_queue_length", queue=queue) == 0
    assert value(samples, "medsplit_celery_queue_length", queue=turns) == 2
    assert len([n for n, _ in samples if n == "medsplit_celery_queue_length"]) == 2


@pytest.mark.django_db
def test_a_broker_that_is_away_is_a_0_not_a_500(token: str, settings) -> None:
    with __import__("socket").socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{port}/0"
    samples = scrape(scraper(token))
    assert value(samples, "medsplit_broker_up") == 0
    assert not any(name == "medsplit_celery_queue_length" for name, _ in samples)
    assert value(samples, "medsplit_jobs", state="draft") == 0  # the rest is still there


@pytest.mark.django_db
def test_openmetrics_when_asked(token: str, broker) -> None:
    response = scraper(token).get(URL, HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")
