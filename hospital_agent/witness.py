"""The hospital witnesses the coordinator's audit chain, which its operators do not control.

Every heartbeat answer names the chain's head (sequence number and hash). The agent keeps
the heads it was shown (``audit-heads.json`` in its work directory) and, every
:data:`CHECK_EVERY` heartbeats, asks for the chain's links from the oldest head it keeps to
now and checks, itself, that every head it witnessed is still there with the same hash,
and that each link names the one before it. Rows are chained by their hashes, so a chain
rewritten anywhere before a head it holds, or cut back behind it, cannot keep that head's
hash: the check catches what the database's owner did even with the coordinator's own MAC
key. After a clean check only the newest head is kept, as the anchor of the next.

A mismatch goes to the agent's log, to ``medsplit-agent status`` (``audit-witness.json``),
and, signed with the agent's identity key, to the coordinator, where the dashboard raises
it. Nothing here is secret: heads and links are hashes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey

from hospital_agent.identity import read_private, write_private
from medsplit.errors import ConfigError
from medsplit.protocol.statements import sign_statement

logger = logging.getLogger(__name__)

HEADS_FILE = "audit-heads.json"
RESULT_FILE = "audit-witness.json"
#: Heartbeats between two checks of the chain.
CHECK_EVERY = 10
#: Heads kept between two checks, at most (the oldest, the anchor, always stays).
MAX_HEADS = 64
PURPOSE = "audit-witness"
_GENESIS = "0" * 64


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str


@dataclass(frozen=True)
class Mismatch:
    """A witnessed head the chain no longer holds."""

    witnessed: Head
    found: str
    message: str


#: Reads the chain's links after a sequence number: ``(links, head)``, where each link is
#: ``{"seq", "prev_hash", "hash"}`` and the head ``{"seq", "hash"}``.
LinksReader = Callable[[int], tuple[list[dict[str, Any]], dict[str, Any]]]


class Witness:
    """The heads this hospital was shown, and the check of them against the chain."""

    def __init__(self, work_dir: Path) -> None:
        self.heads_path = work_dir / HEADS_FILE
        self.result_path = work_dir / RESULT_FILE
        self._beats = 0

    # -- what was shown -----------------------------------------------------------------

    def heads(self) -> list[Head]:
        if not self.heads_path.exists():
            return []
        try:
            raw = json.loads(read_private(self.heads_path))
            return [Head(int(h["seq"]), str(h["hash"])) for h in raw]
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{self.heads_path} is damaged ({e}); move it aside") from e

    def saw(self, head: dict[str, Any] | None) -> bool:
        """Keep the head a heartbeat answer named; ``True`` when a check is due."""
        self._beats += 1
        if not head or "seq" not in head or "hash" not in head:
            return False
        shown = Head(int(head["seq"]), str(head["hash"]))
        heads = self.heads()
        if not heads or heads[-1] != shown:
            if len(heads) >= MAX_HEADS:
                heads = [heads[0], *heads[-(MAX_HEADS - 2) :]]
            self._keep([*heads, shown])
        return self._beats % CHECK_EVERY == 0

    # -- the check ------------------------------------------------------------------------

    def check(self, read_links: LinksReader) -> Mismatch | None:
        """Check every kept head against the chain (see the module docstring)."""
        heads = self.heads()
        if not heads:
            return None
        anchor = heads[0]
        chain: dict[int, tuple[str, str]] = {}
        after = max(0, anchor.seq - 1)
        while True:
            links, head = read_links(after)
            for link in links:
                chain[int(link["seq"])] = (str(link["prev_hash"]), str(link["hash"]))
            if not links or int(links[-1]["seq"]) >= int(head["seq"]):
                break
            after = int(links[-1]["seq"])
        now = Head(int(head["seq"]), str(head["hash"]))
        mismatch = self._compare(heads, chain, now)
        self._record(mismatch, now)
        if mismatch is None:
            self._keep([now] if now.seq else [])
        return mismatch

    def _compare(
        self, heads: list[Head], chain: dict[int, tuple[str, str]], now: Head
    ) -> Mismatch | None:
        for witnessed in heads:
            if witnessed.seq == 0:
                continue
            if witnessed.seq > now.seq:
                return Mismatch(
                    witnessed,
                    "missing",
                    f"the chain now ends at event {now.seq}, but this hospital was shown "
                    f"event {witnessed.seq} (hash {witnessed.hash[:16]}...): the chain's "
                    "tail was cut and its head rewound",
                )
            found = chain.get(witnessed.seq)
            if found is None or found[1] != witnessed.hash:
                return Mismatch(
                    witnessed,
                    found[1] if found else "missing",
                    f"event {witnessed.seq} of the chain no longer has the hash this "
                    f"hospital was shown ({witnessed.hash[:16]}...): the history was rewritten",
                )
        # The links between must name each other: a hole means rows were taken out.
        for seq in sorted(chain)[1:]:
            previous = chain.get(seq - 1)
            if previous is not None and chain[seq][0] != previous[1]:
                return Mismatch(
                    Head(seq - 1, previous[1]),
                    chain[seq][0],
                    f"event {seq} names {chain[seq][0][:16]}... as the one before it, but "
                    f"event {seq - 1} hashes to {previous[1][:16]}...: the chain is broken",
                )
        return None

    # -- what is said --------------------------------------------------------------------

    def statement(self, hospital: str, mismatch: Mismatch) -> dict[str, Any]:
        return {
            "hospital": hospital,
            "witnessed": asdict(mismatch.witnessed),
            "found": mismatch.found,
            "message": mismatch.message,
            "at": _now(),
        }

    def signed(
        self, identity: MLDSA65PrivateKey, hospital: str, mismatch: Mismatch
    ) -> tuple[str, str]:
        """The statement of ``mismatch``, signed for the coordinator."""
        return sign_statement(identity, PURPOSE, self.statement(hospital, mismatch))

    def last_result(self) -> dict[str, Any] | None:
        """What the last check found, for ``medsplit-agent status``."""
        if not self.result_path.exists():
            return None
        try:
            return json.loads(read_private(self.result_path))
        except ValueError:
            return None

    def _record(self, mismatch: Mismatch | None, head: Head) -> None:
        result: dict[str, Any] = {"checked_at": _now(), "head": asdict(head), "ok": not mismatch}
        if mismatch is not None:
            result["mismatch"] = {**asdict(mismatch), "witnessed": asdict(mismatch.witnessed)}
            logger.error("AUDIT CHAIN CHANGED behind this hospital: %s", mismatch.message)
        write_private(self.result_path, json.dumps(result, indent=1).encode())

    def _keep(self, heads: list[Head]) -> None:
        write_private(self.heads_path, json.dumps([asdict(h) for h in heads]).encode())


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
