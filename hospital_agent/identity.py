"""What the agent keeps in its work directory, readable by its own user only (0600).

* ``agent.key``: its X25519 private key, generated here on the first run; it never
  leaves the machine (the coordinator gets the public key at enrolment).
* ``credentials.json``: the agent token and the relay credentials from enrolment.
* ``jobs/``: snapshots during turns, and the weights of finished jobs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from medsplit.errors import ConfigError
from medsplit.protocol.sealing import (
    generate_private_key,
    private_key_from_bytes,
    private_key_to_bytes,
)
from medsplit.turns.checkpoints import write_atomic

KEY_FILE = "agent.key"
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True)
class Credentials:
    """What enrolment gave the agent."""

    hospital: str
    token: str
    relay_url: str
    relay_username: str
    relay_password: str

    def relay(self) -> str:
        """The relay's URL with this hospital's user and password in it."""
        scheme, _, rest = self.relay_url.partition("://")
        host = rest.rsplit("@", 1)[-1]  # any credentials in the coordinator's URL go
        return f"{scheme}://{self.relay_username}:{self.relay_password}@{host}"


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` atomically, as a file only this user may read."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = os.umask(0o077)
    try:
        write_atomic(path, data)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)


def load_or_create_key(work_dir: Path) -> X25519PrivateKey:
    """The agent's private key, made on first use.

    Raises:
        ConfigError: the key file exists but is not a key, or others may read it.
    """
    path = work_dir / KEY_FILE
    if not path.exists():
        key = generate_private_key()
        write_private(path, private_key_to_bytes(key))
        return key
    _check_private(path)
    try:
        return private_key_from_bytes(path.read_bytes())
    except ValueError as e:
        raise ConfigError(f"{path} is not an X25519 private key: {e}") from e


def save_credentials(work_dir: Path, credentials: Credentials) -> None:
    write_private(work_dir / CREDENTIALS_FILE, json.dumps(asdict(credentials)).encode())


def load_credentials(work_dir: Path) -> Credentials | None:
    """The stored credentials, or ``None`` before enrolment."""
    path = work_dir / CREDENTIALS_FILE
    if not path.exists():
        return None
    _check_private(path)
    try:
        return Credentials(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"{path} is damaged ({e}); delete it and enrol again with a new code"
        ) from e


def forget_credentials(work_dir: Path) -> None:
    (work_dir / CREDENTIALS_FILE).unlink(missing_ok=True)


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"{path} may be read by other users (mode {mode:o}); run `chmod 600 {path}`"
        )
