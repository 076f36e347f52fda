"""Fixtures of the agent's end-to-end tests: the coordinator's people and Redis."""

from tests.platform_apps.conftest import (
    _fast_passwords,
    _flushable_audit_log,
    admin_actor,
    consortium_admin,
)
from tests.redis_server import redis_url

__all__ = [
    "_fast_passwords",
    "_flushable_audit_log",
    "admin_actor",
    "consortium_admin",
    "redis_url",
]
