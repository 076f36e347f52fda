"""What the agent keeps in its work directory, readable by its own user only (0600).

* ``identity.key``: the seed of its ML-DSA-65 identity key, made here on the first run; it
  never leaves the machine (the coordinator gets the public key at enrolment). It signs
  every hand-off and every per-job key the agent publishes.
* ``credentials.json``: the agent token and the relay credentials from enrolment, and the
  identity generation the coordinator acknowledged (0: enrolled before identity keys).
* ``peers.json``: the identity fingerprints it pinned for the other hospitals
  (:mod:`hospital_agent.pins`).
* ``jobs/``: per-job recipient keys (:mod:`hospital_agent.job_keys`), snapshots during
  turns, and the weights of finished jobs.
* ``agent.key``: the static X25519 key of earlier releases; deleted once the agent has
  moved to its identity key.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from medsplit.errors import ConfigError
from medsplit.protocol.keys import (
    generate_identity_key,
    identity_key_from_bytes,
    identity_key_to_bytes,
)
from medsplit.turns.stores import write_atomic

IDENTITY_FILE = "identity.key"
LEGACY_KEY_FILE = "agent.key"
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True)
class Credentials:
    """What enrolment gave the agent.

    ``identity_generation`` is the coordinator's count of this hospital's identity keys
    when it acknowledged this agent's; 0 means it holds only a legacy X25519 key for it.
    """

    hospital: str
    token: str
    relay_url: str
    relay_username: str
    relay_password: str
    identity_generation: int = 0

    def relay(self) -> str:
        """The relay's URL with this hospital's user and password in it."""
        scheme, _, rest = self.relay_url.partition("://")
        host = rest.rsplit("@", 1)[-1]  # any credentials in the coordinator's URL go
        return f"{scheme}://{self.relay_username}:{self.relay_password}@{host}"

    def with_generation(self, generation: int) -> Credentials:
        return replace(self, identity_generation=generation)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` atomically, as a file only this user may read."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = os.umask(0o077)
    try:
        write_atomic(path, data)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)


def read_private(path: Path) -> bytes:
    """The bytes of a file only this user may read.

    Raises:
        ConfigError: others may read it.
    """
    check_private(path)
    return path.read_bytes()


def forget_private(path: Path) -> bool:
    """Overwrite a key file with zeros, then delete it; ``False`` if there was none.

    Overwriting first keeps the key from lingering in free blocks on simple file systems;
    on journalling or copy-on-write ones (and SSDs) only disk encryption makes it certain.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    with open(path, "r+b") as f:
        f.write(bytes(size))
        f.flush()
        os.fsync(f.fileno())
    path.unlink()
    return True


def load_or_create_identity(work_dir: Path) -> MLDSA65PrivateKey:
    """The agent's identity key, made on first use.

    Raises:
        ConfigError: the key file exists but is not a key, or others may read it.
    """
    key = load_identity(work_dir)
    if key is None:
        key = generate_identity_key()
        write_private(work_dir / IDENTITY_FILE, identity_key_to_bytes(key))
    return key


def load_identity(work_dir: Path) -> MLDSA65PrivateKey | None:
    """The agent's identity key, or ``None`` before the first run (it makes none).

    Raises:
        ConfigError: the key file is not a key, or others may read it.
    """
    path = work_dir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        return identity_key_from_bytes(read_private(path))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path} is not an ML-DSA-65 identity key: {e}") from e


def has_legacy_key(work_dir: Path) -> bool:
    return (work_dir / LEGACY_KEY_FILE).exists()


def forget_legacy_key(work_dir: Path) -> bool:
    """Delete the X25519 key of earlier releases: it opens no blob this agent will be sent,
    and kept, a thief could open past hand-offs recorded with it."""
    return forget_private(work_dir / LEGACY_KEY_FILE)


def save_credentials(work_dir: Path, credentials: Credentials) -> None:
    write_private(work_dir / CREDENTIALS_FILE, json.dumps(asdict(credentials)).encode())


def load_credentials(work_dir: Path) -> Credentials | None:
    """The stored credentials, or ``None`` before enrolment."""
    path = work_dir / CREDENTIALS_FILE
    if not path.exists():
        return None
    try:
        return Credentials(**json.loads(read_private(path)))
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"{path} is damaged ({e}); delete it and enrol again with a new code"
        ) from e


def forget_credentials(work_dir: Path) -> None:
    (work_dir / CREDENTIALS_FILE).unlink(missing_ok=True)


def check_private(path: Path) -> None:
    """Raises: ConfigError: others may read ``path``."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"{path} may be read by other users (mode {mode:o}); run `chmod 600 {path}`"
        )
