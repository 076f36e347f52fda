"""Relay ACL provisioners for tests, configured through settings like a real one."""

from __future__ import annotations

from typing import ClassVar

from hospitals.errors import RelayProvisioningFailed


class RecordingProvisioner:
    """Remembers every call (class-wide: the services build a new instance per call)."""

    calls: ClassVar[list[tuple[str, dict]]] = []

    def provision(self, *, username: str, password_sha256: str, slug: str) -> None:
        self.calls.append(
            ("provision", {"username": username, "password_sha256": password_sha256, "slug": slug})
        )

    def revoke(self, *, username: str) -> None:
        self.calls.append(("revoke", {"username": username}))

    def suspend(self, *, username: str, slug: str) -> int:
        self.calls.append(("suspend", {"username": username, "slug": slug}))
        return 0


class FailingProvisioner:
    """A relay that cannot be reached."""

    def provision(self, *, username: str, password_sha256: str, slug: str) -> None:
        raise RelayProvisioningFailed("the relay cannot be reached")

    def revoke(self, *, username: str) -> None:
        raise RelayProvisioningFailed("the relay cannot be reached")

    def suspend(self, *, username: str, slug: str) -> int:
        raise RelayProvisioningFailed("the relay cannot be reached")


class NotAProvisioner:
    """Has neither method."""
