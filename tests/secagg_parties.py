"""Hospitals with real keys for the secure-aggregation tests: each has its ML-DSA-65
identity and a per-job recipient key signed by it, and the others pin its identity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, generate_identity_key
from medsplit.secagg import FixedPoint, HospitalRound, Peer, RoundId, VectorLayout


@dataclass
class Keys:
    identity: object
    recipient: RecipientKey
    signed: SignedRecipientKey


def make_keys(job: str, names: list[str]) -> dict[str, Keys]:
    keys = {}
    for name in names:
        identity = generate_identity_key()
        recipient = RecipientKey.generate()
        signed = SignedRecipientKey.sign(
            job=job, hospital=name, key=recipient.public(), identity=identity
        )
        keys[name] = Keys(identity, recipient, signed)
    return keys


def hospital_rounds(
    round_id: RoundId,
    keys: Mapping[str, Keys],
    layout: VectorLayout,
    fixed: FixedPoint | None = None,
) -> dict[str, HospitalRound]:
    """One :class:`HospitalRound` per participant, not yet given each other's secrets."""
    return {
        me: HospitalRound(
            round_id,
            me,
            identity=keys[me].identity,
            recipient_key=keys[me].recipient,
            peers={
                h: Peer(keys[h].identity.public_key(), keys[h].signed)
                for h in round_id.participants
                if h != me
            },
            layout=layout,
            fixed=fixed,
        )
        for me in round_id.participants
    }


def exchange(rounds: Mapping[str, HospitalRound]) -> None:
    """Every sealed secret delivered to its recipient (as the relay would)."""
    for side in rounds.values():
        for secret in side.outgoing():
            rounds[secret.recipient].accept(secret)


def random_fronts(
    names: list[str], generator: torch.Generator, scale: float = 1.0
) -> dict[str, dict[str, torch.Tensor]]:
    """A small front per hospital: a conv weight, a bias and a BatchNorm's running stats."""
    return {
        name: {
            "conv.weight": torch.randn(8, 3, 3, 3, generator=generator) * scale,
            "conv.bias": torch.randn(8, generator=generator) * scale,
            "bn.running_mean": torch.randn(8, generator=generator) * scale,
            "bn.running_var": torch.rand(8, generator=generator) * scale,
        }
        for name in names
    }
