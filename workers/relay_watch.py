"""The relay guard (``workers/relay_guard.py``) tied to the coordinator's database: each
job's bounds from its split, and what happens to a hospital that goes beyond them (its
relay user suspended, its running turns failed, all with the reason)."""

from __future__ import annotations

import logging

import redis
from django.conf import settings

from hospitals.models import Hospital, RedisCredential
from hospitals.relay_acl import relay_keys
from hospitals.relay_services import relay_user_suspend
from kernel.actors import Actor
from medsplit.channel.connect import connect
from medsplit.errors import ModelModuleRefused
from medsplit.training.relay_limits import RelayLimits, relay_limits
from medsplit.training.setup import cached_split
from training.models import Job, JobParticipant, Turn
from training.services import turn_fail
from workers.relay_guard import Overuse, RelayGuard

logger = logging.getLogger(__name__)

#: How frames name a job (``Job.training_config``): ``job-<id>``.
_JOB_NAME = "job-"


def job_limits(job_name: str, hospital: str) -> RelayLimits | None:
    """The relay bounds of job ``job_name`` (``job-N``) for ``hospital``, or ``None`` when
    no such job exists or the hospital takes no part in it."""
    if not job_name.startswith(_JOB_NAME) or not job_name[len(_JOB_NAME) :].isdigit():
        return None
    job_id = int(job_name[len(_JOB_NAME) :])
    if not JobParticipant.objects.filter(job_id=job_id, hospital__slug=hospital).exists():
        return None
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    try:
        return limits_of_job(job)
    except ModelModuleRefused as e:
        # No turn of it runs on this worker, so its keys may hold nothing beyond their
        # own cost; one job this worker may not build leaves the sweep to the others.
        logger.warning("relay guard: job %s: %s", job_id, e)
        return None


def limits_of_job(job: Job) -> RelayLimits:
    """The relay bounds of ``job`` (its split is traced once per process and kept)."""
    described = job.job_description()
    config = described.training_config(f"job-{job.pk}")
    fronts = [cached_split(f.model, (f.cut,)) for f in described.party_fronts()]
    split = cached_split(described.job_model(), config.cuts)
    return relay_limits(split, config, label_shape=described.label_shape, fronts=fronts)


def guard(client: redis.Redis | None = None) -> RelayGuard:
    """A guard over the relay as the workers' user."""
    client = client or connect(settings.MEDSPLIT["WORKER_REDIS_URL"], socket_timeout=10)
    return RelayGuard(client, relay_keys(), job_limits)


def enforce(hospital: Hospital, overuse: Overuse) -> str:
    """Suspend ``hospital``'s relay user and fail its running turns, with the reason;
    every other hospital's turns go on. Returns the reason."""
    reason = overuse.reason()
    relay_user_suspend(actor=Actor.system(), hospital=hospital, reason=reason)
    for turn in Turn.objects.filter(hospital=hospital, status=Turn.Status.RUNNING):
        turn_fail(turn=turn, reason=f"relay user suspended: {reason}")
    return reason


def sweep_relay() -> list[str]:
    """Check every hospital with a live relay user; enforce on those beyond their bounds.

    Returns:
        The slugs of the hospitals suspended by this sweep.
    """
    live = RedisCredential.objects.filter(revoked_at__isnull=True, suspended_at__isnull=True)
    hospitals = Hospital.objects.filter(redis__in=live).order_by("slug")
    checker = guard()
    suspended = []
    try:
        for hospital in hospitals:
            overuse = checker.check(hospital.slug)
            if overuse is not None:
                logger.warning("%s", overuse.reason())
                enforce(hospital, overuse)
                suspended.append(hospital.slug)
    finally:
        checker.client.close()
    return suspended
