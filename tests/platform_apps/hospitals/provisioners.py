"""Relay ACL provisioners for tests, configured through settings like a real one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hospitals.errors import RelayProvisioningFailed


class RecordingProvisioner:
    """Remembers every call (class-wide: the services build a new instance per call)."""

    calls: ClassVar[list[tuple[str, dict]]] = []

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        self.calls.append(
            (
                "provision",
                {
                    "username": username,
                    "password_sha256": password_sha256,
                    "key_patterns": list(key_patterns),
                },
            )
        )

    def revoke(self, *, username: str) -> None:
        self.calls.append(("revoke", {"username": username}))


class FailingProvisioner:
    """A relay that cannot be reached."""

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        raise RelayProvisioningFailed("the relay cannot be reached")

    def revoke(self, *, username: str) -> None:
        raise RelayProvisioningFailed("the relay cannot be reached")


class NotAProvisioner:
    """Has neither method."""
