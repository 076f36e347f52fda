"""The identity fingerprints this agent pinned for the other hospitals (``peers.json``).

The coordinator hands out every hospital's identity key, so a dishonest coordinator could
hand out its own and read hand-offs in the middle. The agent therefore pins each peer's
fingerprint the first time it sees it and afterwards accepts another key for that peer only
when the coordinator shows a re-enrolment of it (its identity generation advanced, which
the coordinator records in its audit log); it logs that loudly, for people to compare the
new fingerprint out of band (``medsplit-agent status`` at both hospitals). Any other change
is refused: nothing is sealed for that peer nor opened from it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey

from hospital_agent.identity import read_private, write_private
from medsplit.errors import ConfigError, MedSplitError, SealError
from medsplit.protocol.keys import fingerprint, format_fingerprint, identity_public_from_b64

logger = logging.getLogger(__name__)

PINS_FILE = "peers.json"


class PeerKeyRefused(MedSplitError):
    """A hospital's identity key, as the coordinator gives it, cannot be trusted."""


@dataclass(frozen=True)
class Pin:
    """A peer's identity as this agent first saw it (or last saw it re-enrolled)."""

    hospital: str
    fingerprint: str
    generation: int
    enrolled_at: str | None
    pinned_at: str


class Pins:
    """The pins of one agent, in ``<work_dir>/peers.json`` (0600)."""

    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / PINS_FILE

    def all(self) -> dict[str, Pin]:
        """Every pin, by hospital.

        Raises:
            ConfigError: the file is damaged, or others may read it.
        """
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(read_private(self.path))
            return {slug: Pin(**pin) for slug, pin in raw.items()}
        except ConfigError:
            raise
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"{self.path} is damaged ({e}): restore it from a backup; deleting it makes "
                "this agent trust whatever keys the coordinator gives next"
            ) from e

    def identity(self, participant: Mapping[str, Any]) -> MLDSA65PublicKey:
        """The identity key of an assignment's ``participant``, once it fits its pin (the
        first key seen for a hospital is pinned).

        Raises:
            PeerKeyRefused: the hospital has no identity key yet, the coordinator's
                fingerprint does not match the key, or the key differs from the pinned one
                without a re-enrolment to show for it.
        """
        slug = str(participant["hospital"])
        key, digits, generation = _identity_of(participant)
        pins = self.all()
        pin = pins.get(slug)
        enrolled_at = participant.get("identity_enrolled_at")
        if pin is not None and pin.fingerprint == digits:
            if generation > pin.generation:  # re-enrolled with the same key: nothing changes
                self._save(pins, _pin(slug, digits, generation, enrolled_at))
            return key
        if pin is None:
            self._save(pins, _pin(slug, digits, generation, enrolled_at))
            logger.info(
                "pinned the identity of %s: %s (generation %d); compare it with %s out of "
                "band (`medsplit-agent status` there)",
                slug,
                format_fingerprint(digits),
                generation,
                slug,
            )
            return key
        if generation <= pin.generation:
            raise PeerKeyRefused(
                f"the coordinator now gives another identity key for {slug} "
                f"({format_fingerprint(digits)}) than the one this agent pinned "
                f"({format_fingerprint(pin.fingerprint)}, generation {pin.generation}), with no "
                f"re-enrolment to show for it (generation {generation}): a dishonest or "
                "compromised coordinator, or a restored database. Nothing is sealed for or "
                f"opened from {slug}. If {slug} really changed its key, compare its new "
                f"fingerprint with it out of band, then delete its entry from {self.path}."
            )
        self._save(pins, _pin(slug, digits, generation, enrolled_at))
        logger.warning(
            "IDENTITY CHANGED: %s re-enrolled (generation %d -> %d, at %s); its identity key "
            "is now %s (was %s). Compare the new fingerprint with %s out of band; if it did "
            "not re-enrol, the coordinator is swapping keys: stop this agent and tell the "
            "consortium.",
            slug,
            pin.generation,
            generation,
            enrolled_at or "an unknown time",
            format_fingerprint(digits),
            format_fingerprint(pin.fingerprint),
            slug,
        )
        return key

    def _save(self, pins: dict[str, Pin], pin: Pin) -> None:
        pins = {**pins, pin.hospital: pin}
        data = {slug: asdict(p) for slug, p in sorted(pins.items())}
        write_private(self.path, json.dumps(data, indent=2).encode())


def check_own_identity(
    participant: Mapping[str, Any], identity: MLDSA65PrivateKey, *, job: int
) -> None:
    """The coordinator must show this hospital with this agent's own identity key.

    Raises:
        PeerKeyRefused: it shows another (or none): someone re-enrolled as this hospital,
            or the coordinator swapped the key. Peers would seal to the other key.
    """
    own = fingerprint(identity)
    try:
        shown = _identity_of(participant)[1]
    except PeerKeyRefused:
        shown = None
    if shown != own:
        raise PeerKeyRefused(
            f"in job {job} the coordinator shows this hospital with the identity key "
            f"{format_fingerprint(shown) if shown else '(none)'}, not this agent's own "
            f"({format_fingerprint(own)}): someone re-enrolled as this hospital, or the "
            "coordinator swapped its key. This agent takes no part in the job; tell the "
            "consortium."
        )


def _identity_of(participant: Mapping[str, Any]) -> tuple[MLDSA65PublicKey, str, int]:
    slug = participant.get("hospital")
    text = participant.get("identity_key")
    if not text:
        raise PeerKeyRefused(
            f"{slug} has no identity key yet (its agent runs a release before identity "
            "keys, or has not moved to them yet): nothing can be sealed for or opened from it"
        )
    try:
        key = identity_public_from_b64(text)
    except (SealError, TypeError) as e:
        raise PeerKeyRefused(f"the identity key the coordinator gives for {slug}: {e}") from e
    digits = fingerprint(key)
    stated = participant.get("identity_fingerprint")
    if stated and stated != digits:
        raise PeerKeyRefused(
            f"the coordinator states the fingerprint {stated} for {slug}'s identity key, "
            f"whose fingerprint is {digits}: refusing it"
        )
    generation = participant.get("identity_generation")
    return key, digits, generation if isinstance(generation, int) else 0


def _pin(slug: str, digits: str, generation: int, enrolled_at: object) -> Pin:
    return Pin(
        hospital=slug,
        fingerprint=digits,
        generation=generation,
        enrolled_at=str(enrolled_at) if enrolled_at else None,
        pinned_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
