"""The coordinator's cache: Redis shared by every process in a deployment, local memory
in the embedded mode (``coordinator.settings``, ``MEDSPLIT_CACHE_URL``).

Throttles, sign-in delays, long-poll slots and cut tables live here, so every gunicorn
process counts and remembers the same. Values are JSON, never pickles: whoever can
write to that Redis can change a count, not run code in the coordinator.
"""

from __future__ import annotations

import json
from typing import Any


class JSONSerializer:
    """Django's Redis cache serializer, with JSON where Django uses pickle.

    Integers are stored as they are (as Django's own serializer does), so that
    ``incr`` and ``decr`` stay single atomic Redis commands.
    """

    def __init__(self, protocol: int | None = None) -> None:
        del protocol  # Django passes pickle's; JSON has none

    def dumps(self, obj: Any) -> int | bytes:
        if type(obj) is int:  # not bool, which JSON keeps apart
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        try:
            return int(data)
        except ValueError:
            return json.loads(data)


def cache_settings(url: str, *, key_prefix: str) -> dict[str, dict[str, Any]]:
    """``CACHES`` for ``url``: a ``redis://``, ``rediss://`` or ``unix://`` URL selects
    Django's Redis cache, shared by every process; an empty one, local memory (one
    process only: the embedded mode and the tests).

    Raises:
        ValueError: a URL of another scheme; the message names the accepted ones.
    """
    if not url:
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"MEDSPLIT_CACHE_URL must be a redis://, rediss:// or unix:// URL, got {scheme}://"
        )
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": key_prefix,
            "OPTIONS": {
                "serializer": "kernel.cache.JSONSerializer",
                # A cache that does not answer fails the request at once rather than
                # holding one of gunicorn's threads.
                "socket_connect_timeout": 2,
                "socket_timeout": 2,
            },
        }
    }
