"""``report.use_resp``: each RESP variant the relay benchmarks compare is what its
connections really use, and a round trip through it keeps the bytes."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import redis
from redis._parsers import _HiredisParser, _RESP2Parser, _RESP3Parser
from redis.connection import HiredisRespSerializer, PythonRespSerializer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import report

from tests.redis_server import redis_url  # noqa: F401

EXPECTED = {
    "pure Python": ((_RESP2Parser, _RESP3Parser), PythonRespSerializer),
    "hiredis": ((_HiredisParser,), PythonRespSerializer),
    "hiredis + its packer": ((_HiredisParser,), HiredisRespSerializer),
}


@pytest.mark.parametrize("variant", report.RESP_VARIANTS)
def test_each_variant_parses_and_packs_as_named(variant: str, redis_url: str) -> None:  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    key = f"medsplit-test-{uuid.uuid4()}"
    try:
        client.ping()  # a connection made before the switch is not reused
        report.use_resp(client, variant)
        data = os.urandom(100_000)
        client.set(key, data)
        assert client.get(key) == data
        conn = client.connection_pool.get_connection()
        try:
            parsers, packer = EXPECTED[variant]
            assert isinstance(conn._parser, parsers)
            assert isinstance(conn._command_packer, packer)
        finally:
            client.connection_pool.release(conn)
    finally:
        client.delete(key)
        client.close()


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown RESP variant"):
        report.use_resp(redis.Redis(), "telnet")
