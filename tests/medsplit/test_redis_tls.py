"""``rediss://``: a frame crosses a real TLS connection to a redis-server of the test's own.

Skipped, saying why, where no redis-server with TLS support is installed.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from medsplit.channel.redis import RedisChannel
from medsplit.errors import ChannelError


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "medsplit-test-relay")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "relay.crt", folder / "relay.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_redis(tmp_path: Path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH to serve TLS")
    cert, key = self_signed(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [
            binary,
            "--port", "0",
            "--tls-port", str(port),
            "--bind", "127.0.0.1",
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert),
            "--tls-auth-clients", "no",
            "--save", "",
            "--appendonly", "no",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"rediss://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, ssl_ca_certs=str(cert), socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    try:
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace")
                pytest.skip(f"redis-server cannot serve TLS here: {output[-300:]}")
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url, cert
    finally:
        client.close()
        process.terminate()
        process.wait(10)


def test_a_frame_crosses_a_tls_connection(tls_redis) -> None:
    url, ca = tls_redis
    sender = RedisChannel(url, ssl_ca_certs=str(ca))
    receiver = RedisChannel(url, ssl_ca_certs=str(ca))
    payload = bytes(range(256)) * 1024
    try:
        sender.send("medsplit:tls:h:up", payload)
        assert receiver.receive("medsplit:tls:h:up", timeout=5) == payload
    finally:
        sender.close()
        receiver.close()


def test_a_relay_whose_certificate_is_not_trusted_is_refused(tls_redis) -> None:
    url, _ = tls_redis
    channel = RedisChannel(url, connect_timeout=2)  # the system's CAs: not this one
    try:
        with pytest.raises(ChannelError, match="certificate verify failed"):
            channel.send("medsplit:tls:h:up", b"x")
    finally:
        channel.close()
