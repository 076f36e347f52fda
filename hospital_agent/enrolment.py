"""Enrolment: the agent gives the coordinator its identity key once, with a one-time code,
and keeps the token and relay credentials it gets back. An agent enrolled before identity
keys moves to one, once, with its current token (:func:`move_to_identity_key`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import Coordinator, CoordinatorRefused, TokenRefused
from hospital_agent.identity import Credentials, forget_legacy_key, save_credentials
from medsplit.errors import ConfigError
from medsplit.protocol.keys import fingerprint, format_fingerprint, identity_public_b64

logger = logging.getLogger(__name__)


def enrol(
    config: AgentConfig, identity: MLDSA65PrivateKey, *, stopping: threading.Event | None = None
) -> Credentials:
    """Enrol with ``config``'s one-time code and keep the credentials in the work directory.

    Raises:
        ConfigError: no code is configured, or the coordinator acknowledged another key.
        CoordinatorRefused: the code was refused.
    """
    if not config.enrolment_code:
        raise ConfigError(
            "this agent is not enrolled yet: give it the one-time enrolment code from the "
            "consortium (enrolment_code, MEDSPLIT_AGENT_ENROLMENT_CODE or --enrolment-code)"
        )
    coordinator = Coordinator(config.coordinator_url, ca_bundle=config.ca_bundle, stopping=stopping)
    answer = coordinator.enrol(
        code=config.enrolment_code, identity_key=identity_public_b64(identity)
    )
    relay = answer["relay"]
    credentials = Credentials(
        hospital=answer["hospital"],
        token=answer["token"]["token"],
        relay_url=relay["url"],
        relay_username=relay["username"],
        relay_password=relay["password"],
        identity_generation=_acknowledged(answer["identity"], identity),
    )
    save_credentials(config.work_dir, credentials)
    forget_legacy_key(config.work_dir)
    logger.info(
        "enrolled as %s (identity %s, generation %d); credentials kept in %s",
        credentials.hospital,
        format_fingerprint(fingerprint(identity)),
        credentials.identity_generation,
        config.work_dir,
    )
    return credentials


def move_to_identity_key(
    config: AgentConfig,
    coordinator: Coordinator,
    identity: MLDSA65PrivateKey,
    credentials: Credentials,
) -> Credentials:
    """Enrolled before identity keys: give the coordinator this agent's identity key with
    its current token (once; the other hospitals see it as a re-enrolment), then delete the
    X25519 key of earlier releases.

    Raises:
        ConfigError: the coordinator holds another identity key for this hospital.
        TokenRefused: the token was revoked.
    """
    try:
        answer = coordinator.move_to_identity_key(identity_key=identity_public_b64(identity))
    except CoordinatorRefused as e:
        if isinstance(e, TokenRefused):
            raise
        raise ConfigError(
            f"{e}. This agent could not move to its identity key: ask the consortium for "
            "a fresh enrolment code and start the agent with it."
        ) from e
    credentials = credentials.with_generation(_acknowledged(answer, identity))
    save_credentials(config.work_dir, credentials)
    deleted = forget_legacy_key(config.work_dir)
    logger.warning(
        "moved to an ML-DSA-65 identity key: %s (generation %d); the other hospitals see "
        "this as a re-enrolment of %s%s. Hand-offs are sealed to per-job keys from now on.",
        format_fingerprint(fingerprint(identity)),
        credentials.identity_generation,
        credentials.hospital,
        "; the X25519 key agent.key is deleted" if deleted else "",
    )
    return credentials


def _acknowledged(answer: dict[str, Any], identity: MLDSA65PrivateKey) -> int:
    """The identity generation the coordinator acknowledged for this agent's key.

    Raises:
        ConfigError: it acknowledged another key.
    """
    if answer.get("fingerprint") != fingerprint(identity):
        raise ConfigError(
            "the coordinator acknowledged another identity key than this agent's "
            f"({answer.get('fingerprint')!r}, this agent's is {fingerprint(identity)}): "
            "refusing to go on; tell the consortium"
        )
    return int(answer["generation"])
