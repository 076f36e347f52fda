"""Split inference against hostile callers: a hospital not in the job, a job not
finished, too many images, and a hospital that sends a malformed or oversized
activation frame to the real worker runner over the real Redis: refused, named, and
nothing applied to any weight. An honest request gets the whole model's predictions."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch
from django.utils import timezone

from audit.models import AuditEvent
from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.data import synthetic_split
from medsplit.protocol import checks
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import TurnIds
from medsplit.turns.frameio import FrameIO
from medsplit.turns.inference import (
    INFERENCE_TOPIC,
    InferenceFailed,
    inference_limits,
    predict_through,
)
from medsplit.wire import Frame, FrameKind
from tests.redis_server import forget_jobs
from training.models import InferenceRequest, Job
from workers import inference_runner
from workers.turn_runner import job_model

platform = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(settings, tmp_path, redis_url: str) -> Iterator[str]:
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "WORKER_REDIS_URL": redis_url,
        "CHECKPOINT_DIR": tmp_path / "checkpoints",
        "TURN_SILENCE_SECONDS": 20.0,
        "INFERENCE_BATCH_SIZE": 8,
    }
    inference_runner.forget_segments()  # job ids start again in each test's database
    yield redis_url
    inference_runner.forget_segments()
    forget_jobs(redis_url, Job.objects.values_list("pk", flat=True))


def completed(make_job, **overrides) -> Job:
    job = make_job(state="completed", rounds=1, seed=uuid.uuid4().int % 1000, **overrides)
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now())
    return job


def ask(agent_client, job: Job, hospital, samples: int):
    return agent_client(hospital).post(
        f"/api/agent/assignments/{job.pk}/inference/", {"samples": samples}, format="json"
    )


@platform
def test_only_a_participant_of_a_completed_job_may_ask(make_job, agent_client, three_hospitals):
    a, b, c = three_hospitals
    job = completed(make_job, participants=[{"hospital": a.slug}, {"hospital": b.slug}])
    outsider = ask(agent_client, job, c, 4)
    assert outsider.status_code == 404, outsider.json()
    running = make_job(state="running", participants=[{"hospital": a.slug}])
    refused = ask(agent_client, running, a, 4)
    assert refused.status_code == 409 and "only a completed job" in refused.json()["message"]
    too_many = ask(agent_client, job, a, 10**9)
    assert too_many.status_code == 400, too_many.json()
    accepted = ask(agent_client, job, a, 4)
    assert accepted.status_code == 202, accepted.json()
    body = accepted.json()
    assert body["serving_batch"] == 16 and body["topic"] == INFERENCE_TOPIC  # min(32, job's 16)
    busy = ask(agent_client, job, a, 4)
    assert busy.status_code == 409 and "still pending" in busy.json()["message"]
    assert InferenceRequest.objects.count() == 1
    event = AuditEvent.objects.get(action="inference.requested")
    assert event.details == {"request": body["request"], "samples": 4, "serving_batch": 16}


def hostile_or_honest(
    job: Job, request: InferenceRequest, redis_url: str, tamper: Callable[[Frame], Frame] | None
):
    """The hospital's side in a thread (hostile with ``tamper``), the real runner here."""
    config = job.training_config()
    model = job_model(job)
    split = model.split(config)
    clients = client_parties(split, config)
    images = synthetic_split(request.samples, shape=model.input_shape, seed=3).images
    channel = RedisChannel(redis_url)
    ids = TurnIds(config.job, 2**40 + request.pk, request.position, config.mode, config.codec)
    limits = inference_limits(
        serving_batch=request.serving_batch, samples=request.samples, num_classes=2
    )
    out: list = []

    def hospital() -> None:
        try:
            out.append(
                predict_through(
                    channel=channel,
                    streams=relay_keys().streams(config.job, request.hospital.slug, "infer"),
                    ids=ids,
                    mode=config.split_mode,
                    split=split,
                    parties=clients,
                    images=images,
                    limits=limits,
                    privacy=config.privacy,
                    reply_timeout=20,
                )
            )
        except Exception as e:
            out.append(e)

    honest = FrameIO.send
    if tamper is not None:  # the hospital plays along but changes what it sends up
        FrameIO.send = lambda self, f: honest(self, tamper(f))  # type: ignore[method-assign]
    try:
        thread = threading.Thread(target=hospital, daemon=True)
        thread.start()
        outcome = inference_runner.run(request.pk, runner="security-test")
        thread.join(20)
    finally:
        FrameIO.send = honest  # type: ignore[method-assign]
        channel.close()
    return outcome, out, images, clients, split


@platform
def test_an_honest_request_gets_the_whole_models_predictions_and_the_segment_stays_loaded(
    runtime: str, make_job, agent_client, hospital_a
) -> None:
    job = completed(make_job)
    config = job.training_config()
    for _ in range(2):
        body = ask(agent_client, job, hospital_a, 20).json()
        request = InferenceRequest.objects.select_related("hospital").get(pk=body["request"])
        outcome, out, images, clients, split = hostile_or_honest(job, request, runtime, None)
        assert outcome == "completed", out
        server = server_party(split, config)  # the job trained no step: the fresh segment
        server.module.eval()
        with torch.no_grad():
            want = torch.cat([server.module(**clients["front"].module(x)) for x in images.split(8)])
        assert torch.equal(out[0].logits, want)
        request.refresh_from_db()
        assert request.status == "completed" and request.batches_served == 3
    assert inference_runner.segment_loads() == 1, "kept loaded between requests"
    served = AuditEvent.objects.filter(action="inference.served").first()
    assert set(served.details) == {"request", "samples", "batches", "bytes_up", "bytes_down"}


def nan(frame: Frame) -> Frame:
    if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS:
        return frame
    return Frame(
        frame.meta, {k: torch.full_like(t, float("nan")) for k, t in frame.tensors.items()}
    )


def oversized(frame: Frame) -> Frame:
    if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS:
        return frame
    return Frame(frame.meta, {k: torch.cat([t, t, t]) for k, t in frame.tensors.items()})


def wrong_shape(frame: Frame) -> Frame:
    if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS:
        return frame
    return Frame(frame.meta, {k: t[..., :-1] for k, t in frame.tensors.items()})


def training_frame(frame: Frame) -> Frame:
    if frame.meta.kind != FrameKind.EVAL_ACTIVATIONS:
        return frame
    meta = dataclasses.replace(frame.meta, kind=FrameKind.ACTIVATIONS)
    return Frame(meta, {**frame.tensors, "labels": torch.zeros(8, dtype=torch.int64)})


@platform
@pytest.mark.parametrize(
    ("tamper", "check"),
    [
        (nan, checks.FINITE),
        (oversized, checks.BATCH),
        (wrong_shape, checks.SHAPE),
        (training_frame, checks.STEPS),
    ],
)
def test_a_hostile_frame_is_refused_named_and_nothing_is_applied(
    runtime: str, make_job, agent_client, hospital_a, tamper, check
) -> None:
    job = completed(make_job)
    body = ask(agent_client, job, hospital_a, 8).json()
    request = InferenceRequest.objects.select_related("hospital").get(pk=body["request"])
    outcome, out, *_ = hostile_or_honest(job, request, runtime, tamper)
    assert outcome == "failed"
    assert isinstance(out[0], InferenceFailed | checks.FrameRejected), out
    request.refresh_from_db()
    assert request.status == "failed"
    assert hospital_a.slug in request.failure_reason and check in request.failure_reason
    assert AuditEvent.objects.filter(action="inference.failed").count() == 1
    # Nothing applied: the worker's loaded segment is the job's final (here: fresh) one.
    config = job.training_config()
    fresh = server_party(job_model(job).split(config), config)
    segment = inference_runner.segment_of(job)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            fresh.module.state_dict().values(),
            segment.party.module.state_dict().values(),
            strict=True,
        )
    )
