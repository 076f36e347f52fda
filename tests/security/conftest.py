"""Fixtures of the attacker tests: the coordinator's people, hospitals and jobs, and Redis."""

from tests.platform_apps.conftest import (
    _fast_passwords,
    _flushable_audit_log,
    admin_actor,
    consortium_admin,
    hospital_a,
    hospital_b,
)
from tests.platform_apps.training.conftest import hospital_c, job_data, make_job, three_hospitals
from tests.redis_server import redis_url

__all__ = [
    "_fast_passwords",
    "_flushable_audit_log",
    "admin_actor",
    "consortium_admin",
    "hospital_a",
    "hospital_b",
    "hospital_c",
    "job_data",
    "make_job",
    "redis_url",
    "three_hospitals",
]
