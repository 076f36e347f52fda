"""The coordinator's cache settings: Redis for a deployment, local memory embedded, and
JSON (never pickle) for what is stored."""

from __future__ import annotations

import pickle

import pytest

from kernel.cache import JSONSerializer, cache_settings


def test_a_redis_url_selects_the_shared_cache_with_json() -> None:
    caches = cache_settings("redis://default:pw@relay:6379/1", key_prefix="medsplit-cache")
    default = caches["default"]
    assert default["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert default["KEY_PREFIX"] == "medsplit-cache"
    assert default["OPTIONS"]["serializer"] == "kernel.cache.JSONSerializer"
    assert cache_settings("", key_prefix="x")["default"]["BACKEND"].endswith("LocMemCache")


def test_another_scheme_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="redis://, rediss:// or unix://"):
        cache_settings("memcached://cache:11211", key_prefix="x")


def test_values_are_json_and_integers_stay_raw_for_incr() -> None:
    serializer = JSONSerializer()
    assert serializer.dumps(7) == 7
    assert serializer.loads(b"7") == 7
    assert serializer.loads(serializer.dumps({"rows": [1.5], "problem": None})) == {
        "rows": [1.5],
        "problem": None,
    }
    with pytest.raises(ValueError):  # a pickle planted in the cache is not run
        serializer.loads(pickle.dumps({"x": 1}))
