"""Fixtures of the attacker tests: the coordinator's people, hospitals and jobs, and Redis."""

from tests.platform_apps.conftest import (
    _fast_passwords,
    _flushable_audit_log,
    admin_actor,
    agent_client,
    client_for,
    consortium_admin,
    hospital_a,
    hospital_admin,
    hospital_b,
    observer,
)
from tests.platform_apps.training.conftest import hospital_c, job_data, make_job, three_hospitals
from tests.redis_server import redis_url
from tests.security.proxy import _deployment, deployment

__all__ = [
    "_deployment",
    "_fast_passwords",
    "_flushable_audit_log",
    "admin_actor",
    "agent_client",
    "client_for",
    "consortium_admin",
    "deployment",
    "hospital_a",
    "hospital_admin",
    "hospital_b",
    "hospital_c",
    "job_data",
    "make_job",
    "observer",
    "redis_url",
    "three_hospitals",
]
