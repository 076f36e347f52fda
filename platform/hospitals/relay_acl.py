"""The hook that creates and removes each hospital's Redis ACL user on the relay.

A hospital's agent talks to the relay as its own Redis user, which may touch only the
keys of its own streams (invariant 3). The coordinator decides the user name, the
password (of which it keeps only the SHA-256, the form ``ACL SETUSER ... #<hex>`` takes)
and the key patterns; a :class:`RedisAclProvisioner` applies them to the relay.

The provisioner is chosen by ``settings.MEDSPLIT["REDIS_ACL_PROVISIONER"]`` (a dotted
path to a class built without arguments). The default, :class:`NoRelayProvisioner`,
only logs that no relay is configured: the real one comes with the Redis runtime.

Services call the provisioner inside their transaction, last: if it raises
:class:`~hospitals.errors.RelayProvisioningFailed`, the enrolment or revocation is
rolled back whole and the caller may retry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from django.conf import settings
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

DEFAULT_PROVISIONER = "hospitals.relay_acl.NoRelayProvisioner"


def relay_username(slug: str) -> str:
    """The Redis user of hospital ``slug``."""
    return f"hospital-{slug}"


def relay_key_pattern(slug: str) -> str:
    """The keys hospital ``slug`` may touch: its streams ``medsplit:{job}:{slug}:up|down``."""
    return f"medsplit:*:{slug}:*"


@runtime_checkable
class RedisAclProvisioner(Protocol):
    """Applies a hospital's relay user to Redis. Both methods are idempotent."""

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        """Create or replace ``username``: this password only, these key patterns only.

        Raises:
            RelayProvisioningFailed: the relay refused or could not be reached.
        """
        ...

    def revoke(self, *, username: str) -> None:
        """Remove ``username`` and drop its connections; a missing user is not an error.

        Raises:
            RelayProvisioningFailed: the relay refused or could not be reached.
        """
        ...


class NoRelayProvisioner:
    """The default: no relay is configured, so there is nothing to apply; says so."""

    def provision(
        self, *, username: str, password_sha256: str, key_patterns: Sequence[str]
    ) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s (keys %s) was not created",
            username,
            ", ".join(key_patterns),
        )

    def revoke(self, *, username: str) -> None:
        logger.warning(
            "no Redis relay provisioner is configured: relay user %s was not removed", username
        )


def get_provisioner() -> RedisAclProvisioner:
    """The configured provisioner (read at each call, so settings overrides apply)."""
    path = settings.MEDSPLIT.get("REDIS_ACL_PROVISIONER") or DEFAULT_PROVISIONER
    provisioner = import_string(path)()
    if not isinstance(provisioner, RedisAclProvisioner):
        raise TypeError(f"MEDSPLIT['REDIS_ACL_PROVISIONER'] = {path!r} is not a provisioner")
    return provisioner
