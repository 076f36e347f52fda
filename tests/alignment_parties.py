"""Vertical parties for the record alignment tests: each a hospital with its own Redis ACL
user on a real relay (made by the coordinator's provisioner), its identity, its per-job
key and pins of the others, and a coordinator stand-in that compares digests as
``platform/training/alignment.py`` does (that service has its own tests)."""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from hospital_agent.alignment import AlignedRecords, align_records
from hospital_agent.data import VerticalRecords
from hospital_agent.identity import Credentials
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import Pins
from hospital_agent.relay import Relay
from medsplit.protocol.keys import (
    SignedRecipientKey,
    fingerprint,
    generate_identity_key,
    identity_public_b64,
)
from tests.redis_server import session_keys


class PartyBoard:
    """One party's view of a :class:`Board` (an agent's coordinator knows who it is)."""

    def __init__(self, board: SharedBoard, slug: str) -> None:
        self.board = board
        self.slug = slug

    def report_alignment(self, *, job: int, digest: str, size: int) -> dict[str, Any]:
        return self.board.report(self.slug, digest, size)

    def alignment(self, *, job: int) -> dict[str, Any]:
        return self.board.state()


class SharedBoard:
    """What every party reported, decided as the coordinator decides."""

    def __init__(self, parties: list[str], minimum: int) -> None:
        self.parties = parties
        self.minimum = minimum
        self.reports: dict[str, tuple[str, int]] = {}
        self.status = "pending"
        self.size: int | None = None
        self.lock = threading.Lock()

    def report(self, slug: str, digest: str, size: int) -> dict[str, Any]:
        with self.lock:
            if self.status in ("mismatch", "too_small"):
                return self._state()
            known = self.reports.get(slug)
            self.reports[slug] = (digest, size)
            if known is not None and known != (digest, size):
                self.status = "mismatch"
            elif slug == self.parties[0] and size < self.minimum:
                self.status, self.size = "too_small", size
            elif all(p in self.reports for p in self.parties):
                digests = {self.reports[p][0] for p in self.parties}
                if len(digests) == 1:
                    self.status, self.size = "agreed", size
                else:
                    self.status = "mismatch"
            return self._state()

    def state(self) -> dict[str, Any]:
        with self.lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        reasons = {
            "mismatch": "the parties hold different intersections",
            "too_small": "the intersection is too small",
        }
        return {
            "status": self.status,
            "size": self.size,
            "minimum": self.minimum,
            "reason": reasons.get(self.status, ""),
        }


@dataclass
class Party:
    """A hospital of a vertical job, with its records."""

    slug: str
    work_dir: Path
    job: int
    relay: Relay
    records: VerticalRecords
    identity: Any = field(default_factory=generate_identity_key)

    def __post_init__(self) -> None:
        self.job_keys = JobKeys(self.work_dir)
        self.pins = Pins(self.work_dir)
        key = self.job_keys.load_or_create(self.job).public()
        self.signed = SignedRecipientKey.sign(
            job=f"job-{self.job}", hospital=self.slug, key=key, identity=self.identity
        )

    @property
    def folder(self) -> Path:
        return self.work_dir / "jobs" / f"job-{self.job}"

    def participant(self) -> dict[str, Any]:
        """As the coordinator's assignment lists it."""
        return {
            "hospital": self.slug,
            "identity_key": identity_public_b64(self.identity),
            "identity_fingerprint": fingerprint(self.identity),
            "identity_generation": 1,
            "recipient_key": self.signed.to_json(),
        }

    def align(
        self,
        participants: list[dict[str, Any]],
        coordinator: Any,
        *,
        seed: int = 7,
        minimum: int = 5,
        timeout: float = 20.0,
        relay: Relay | None = None,
    ) -> AlignedRecords:
        return align_records(
            relay=relay or self.relay,
            keys=session_keys(),
            coordinator=coordinator,
            job=self.job,
            me=self.slug,
            participants=participants,
            records=self.records,
            seed=seed,
            minimum=minimum,
            identity=self.identity,
            pins=self.pins,
            job_keys=self.job_keys,
            folder=self.folder,
            timeout=timeout,
        )


def records(ids: list[str], *, features: int, labelled: bool, seed: int) -> VerticalRecords:
    """Records of ``ids`` in a shuffled order, with random features (and labels)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(ids), generator=generator).tolist()
    shuffled = tuple(ids[i] for i in order)
    values = torch.randn(len(ids), features, generator=generator)
    labels = torch.randint(0, 2, (len(ids),), generator=generator) if labelled else None
    return VerticalRecords(shuffled, values, labels)


@dataclass
class Consortium:
    """Makes parties on one relay, each with a Redis user of its own; cleans up after."""

    redis_url: str
    tmp_path: Path
    job: int = field(default_factory=lambda: secrets.randbelow(10**9) + 1)
    users: list[str] = field(default_factory=list)

    def party(self, slug: str, records: VerticalRecords) -> Party:
        from hospitals.relay_acl import RedisAclUsers, relay_username

        password = secrets.token_urlsafe(24)
        username = relay_username(slug, session_keys())
        RedisAclUsers(self.redis_url).provision(
            username=username,
            password_sha256=hashlib.sha256(password.encode()).hexdigest(),
            slug=slug,
        )
        self.users.append(username)
        host = self.redis_url.split("://", 1)[1]
        relay = Relay(Credentials(slug, "t", f"redis://{host}", username, password), timeout=5)
        return Party(slug, self.tmp_path / slug, self.job, relay, records)

    def admin(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def close(self) -> None:
        from hospitals.relay_acl import RedisAclUsers

        client = self.admin()
        try:
            for key in client.scan_iter(match=f"{session_keys().prefix}:*{{job-{self.job}}}*"):
                client.delete(key)
        finally:
            client.close()
        for username in self.users:
            RedisAclUsers(self.redis_url).revoke(username=username)


@pytest.fixture
def consortium(redis_url: str, tmp_path: Path) -> Iterator[Consortium]:
    if not redis_url.startswith("redis://"):
        pytest.skip("the alignment tests use a Redis reached over TCP, with ACL users")
    made = Consortium(redis_url, tmp_path)
    yield made
    made.close()


def run_all(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each call in a thread of its own; what each returned or raised."""
    results: dict[str, Any] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            results[name] = call()
        except BaseException as e:  # handed to the test
            results[name] = e

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
