"""The agent checks the coordinator's certificate with its own ``ca_bundle``, whatever
CA bundle the machine's environment names (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE): requests
would otherwise let those override a session's ``verify`` without a word."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hospital_agent.coordinator import Backoff, Coordinator, CoordinatorUnreachable
from tests.medsplit.test_redis_tls import self_signed


class _Chain(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"links": [], "head": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server for 127.0.0.1 whose certificate only its own CA file vouches for."""
    cert, key = self_signed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Chain)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_the_agents_ca_bundle_wins_over_the_environments(
    https: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    url, ca = https
    (tmp_path / "other").mkdir()
    other, _ = self_signed(tmp_path / "other")
    monkeypatch.setenv(variable, str(other))  # a bundle without the consortium's CA
    coordinator = Coordinator(url, ca_bundle=str(ca), backoff=Backoff(give_up_after=0))
    assert coordinator.audit_chain(after=0) == {"links": [], "head": None}


def test_without_a_ca_bundle_a_private_certificate_is_refused(
    https: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = https
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    coordinator = Coordinator(url, backoff=Backoff(give_up_after=0))
    with pytest.raises(CoordinatorUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        coordinator.audit_chain(after=0)
