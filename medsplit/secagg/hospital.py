"""The hospital's side of one round attempt: seal its secrets to the others, open theirs,
mask its front, and unmask the aggregate into the weighted average."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey, MLDSA65PublicKey

from medsplit.protocol.keys import RecipientKey, SignedRecipientKey
from medsplit.secagg.errors import MessageError, SecAggError, SeedError
from medsplit.secagg.fixedpoint import FixedPoint
from medsplit.secagg.layout import VectorLayout
from medsplit.secagg.masks import (
    GROUP,
    PAIR,
    SECRET_BYTES,
    draw_secret,
    group_mask,
    open_secret,
    pair_mask,
    seal_secret,
)
from medsplit.secagg.messages import Aggregate, MaskedSubmission
from medsplit.secagg.rounds import RoundId

__all__ = ["HospitalRound", "Peer", "SealedSecret"]


@dataclass(frozen=True)
class Peer:
    """Another participant as this hospital knows it: its pinned identity key and its
    per-job recipient key (as the assignment lists them)."""

    identity: MLDSA65PublicKey
    recipient_key: SignedRecipientKey


@dataclass(frozen=True)
class SealedSecret:
    """A sealed pair seed or group key, for the relay to carry to ``recipient``."""

    kind: str
    sender: str
    recipient: str
    blob: bytes


class HospitalRound:
    """One hospital in one round attempt.

    Use: :meth:`outgoing` (send each to its recipient), :meth:`accept` each secret
    received, then :meth:`mask` once, and :meth:`unmask` the aggregate.

    Args:
        round_id: the round attempt.
        me: this hospital's name (a participant).
        identity: this hospital's identity key.
        recipient_key: this hospital's per-job recipient key.
        peers: every other participant, by name.
        layout: the layout of the state dict averaged.
        fixed: the ring's scale.
    """

    def __init__(
        self,
        round_id: RoundId,
        me: str,
        *,
        identity: MLDSA65PrivateKey,
        recipient_key: RecipientKey,
        peers: Mapping[str, Peer],
        layout: VectorLayout,
        fixed: FixedPoint | None = None,
    ) -> None:
        if me not in round_id.weights:
            raise SecAggError(f"{me!r} is not a participant of this round")
        others = set(round_id.participants) - {me}
        if others - set(peers):
            raise SecAggError(f"no keys for the participants {sorted(others - set(peers))}")
        self.round_id = round_id
        self.me = me
        self.layout = layout
        self.fixed = fixed or FixedPoint()
        self._identity = identity
        self._recipient_key = recipient_key
        self._peers = {name: peers[name] for name in sorted(others)}
        # Secrets this hospital draws: the seeds of pairs where it comes first, and the
        # group key if it leads. Fresh for every RoundId: a restart draws anew.
        self._seeds = {h: draw_secret() for h in self._peers if me < h}
        self._group_key = draw_secret() if me == round_id.leader else None
        self._masked = False

    # -- kept across a restart of the hospital's process -------------------------------

    def saved(self) -> dict[str, Any]:
        """This attempt's secrets (drawn and received) as JSON: what a hospital keeps,
        as privately as its per-job key, so that a restarted process masks with the
        seeds the others already hold and can still remove the group mask."""
        b64 = base64.b64encode
        return {
            "round_digest": self.round_id.digest(),
            "me": self.me,
            "seeds": {h: b64(seed).decode("ascii") for h, seed in self._seeds.items()},
            "group_key": b64(self._group_key).decode("ascii") if self._group_key else None,
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take back the secrets of :meth:`saved` (of this very attempt and hospital).

        Raises:
            SecAggError: they were saved for another attempt or hospital, or are malformed.
        """
        if saved.get("round_digest") != self.round_id.digest() or saved.get("me") != self.me:
            raise SecAggError(
                f"the saved secrets are of another round attempt or hospital than round "
                f"{self.round_id.round} attempt {self.round_id.attempt} of {self.me!r}"
            )
        seeds, group = saved.get("seeds"), saved.get("group_key")
        if not isinstance(seeds, dict) or set(seeds) - set(self._peers):
            raise SecAggError("the saved secrets name hospitals that are not peers of this round")
        try:
            restored = {h: _secret(v) for h, v in seeds.items()}
            key = _secret(group) if group is not None else None
        except (binascii.Error, TypeError, ValueError) as e:
            raise SecAggError(f"the saved secrets are malformed: {e}") from None
        drawn = {h for h in self._peers if self.me < h}
        if not drawn <= set(restored) or (self.me == self.round_id.leader and key is None):
            raise SecAggError("the saved secrets lack what this hospital drew itself")
        self._seeds = restored
        self._group_key = key

    @property
    def expected(self) -> tuple[tuple[str, str], ...]:
        """The (kind, sender) of every secret still to be accepted."""
        wanted = [(PAIR, h) for h in self._peers if h < self.me and h not in self._seeds]
        if self._group_key is None:
            wanted.append((GROUP, self.round_id.leader))
        return tuple(wanted)

    def outgoing(self) -> list[SealedSecret]:
        """The secrets this hospital seals for the others (the same secrets each call, sealed
        anew)."""
        out = []
        for h, seed in self._seeds.items():
            if h > self.me:
                out.append(self._seal(PAIR, h, seed))
        if self.me == self.round_id.leader:
            assert self._group_key is not None
            out.extend(self._seal(GROUP, h, self._group_key) for h in self._peers)
        return out

    def _seal(self, kind: str, recipient: str, secret: bytes) -> SealedSecret:
        peer = self._peers[recipient]
        blob = seal_secret(
            secret,
            kind=kind,
            round_id=self.round_id,
            sender=self.me,
            recipient=recipient,
            identity=self._identity,
            recipient_key=peer.recipient_key,
            recipient_identity=peer.identity,
        )
        return SealedSecret(kind, self.me, recipient, blob)

    def accept(self, secret: SealedSecret) -> None:
        """Open a secret sealed for this hospital.

        Raises:
            SeedError: not expected from this sender (or already accepted), or it does not
                open for this round attempt.
        """
        if secret.recipient != self.me or (secret.kind, secret.sender) not in self.expected:
            raise SeedError(
                f"{self.me!r} expects no {secret.kind} secret from {secret.sender!r} in this "
                f"round attempt (still expected: {list(self.expected)})"
            )
        value = open_secret(
            secret.blob,
            kind=secret.kind,
            round_id=self.round_id,
            sender=secret.sender,
            recipient=self.me,
            recipient_key=self._recipient_key,
            sender_identity=self._peers[secret.sender].identity,
        )
        if secret.kind == PAIR:
            self._seeds[secret.sender] = value
        else:
            self._group_key = value

    def mask(self, state: Mapping[str, torch.Tensor]) -> MaskedSubmission:
        """This hospital's masked submission of ``state``; once per round attempt (a second
        vector under the same masks would give away the difference of the two).

        Raises:
            SecAggError: secrets are missing, or this hospital already masked a vector.
            FixedPointError: the state does not fit the ring.
        """
        if self.expected:
            raise SecAggError(f"{self.me!r} cannot mask yet: waiting for {list(self.expected)}")
        if self._masked:
            raise SecAggError(
                f"{self.me!r} already masked a vector in this round attempt: restart the "
                "round (a new attempt) to submit another"
            )
        self._masked = True
        rid, length = self.round_id, self.layout.length
        vector = self.fixed.encode(
            self.layout.flatten(state), rid.weights[self.me], rid.total_weight
        )
        for h, seed in self._seeds.items():
            low, high = sorted((self.me, h))
            mask = pair_mask(seed, rid, low, high, length)
            if self.me == low:
                vector += mask
            else:
                vector -= mask  # uint64: wraps modulo 2**64
        if self.me == rid.leader:
            assert self._group_key is not None
            vector += group_mask(self._group_key, rid, length)
        return MaskedSubmission.for_round(rid, self.me, vector)

    def unmask(self, aggregate: Aggregate) -> dict[str, torch.Tensor]:
        """The weighted average of the fronts, from the aggregate of this round attempt.

        Raises:
            MessageError: the aggregate is for another round attempt or has another shape.
        """
        rid = self.round_id
        if (aggregate.job, aggregate.round, aggregate.attempt, aggregate.round_digest) != (
            rid.job,
            rid.round,
            rid.attempt,
            rid.digest(),
        ):
            raise MessageError(
                f"the aggregate is for round {aggregate.round} attempt {aggregate.attempt} of "
                f"{aggregate.job!r:.80}, not this round attempt of {rid.job!r}"
            )
        if aggregate.dtype != "uint64" or aggregate.vector.shape[0] != self.layout.length:
            raise MessageError(
                f"the aggregate holds {aggregate.vector.shape[0]} {aggregate.dtype} values, "
                f"expected {self.layout.length} uint64"
            )
        if self._group_key is None:
            raise SecAggError(f"{self.me!r} has not received the group key of this round")
        total = aggregate.vector - group_mask(self._group_key, rid, self.layout.length)
        return self.layout.unflatten(self.fixed.decode(total, rid.total_weight))

    def average_ring_sum(self, ring_sum: np.ndarray) -> dict[str, torch.Tensor]:
        """Decode an unmasked ring sum (as :func:`clear_weighted_sum` gives) into a state
        dict: what :meth:`unmask` does after removing the group masks."""
        return self.layout.unflatten(self.fixed.decode(ring_sum, self.round_id.total_weight))


def _secret(value: object) -> bytes:
    if not isinstance(value, str):
        raise TypeError("a secret is base64 text")
    raw = base64.b64decode(value, validate=True)
    if len(raw) != SECRET_BYTES:
        raise ValueError(f"a secret has {SECRET_BYTES} bytes")
    return raw
