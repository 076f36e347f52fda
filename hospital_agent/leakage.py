"""The label-leakage audit of a vertical job, between its parties.

Li et al. (ICLR 2022): the gradients a passive party receives are functions of the labels.
Each passive party scores what it received the way an attacker in its place would (the
norm and the cosine attacks, :mod:`medsplit.training.label_leakage`), one score per record
and step, and seals only those scores for the label party; the label party, which alone
holds the labels, computes each attack's ROC AUC against them and reports the AUCs to the
coordinator. No party holds both the labels and the gradients; the coordinator sees four
numbers per passive party and round.

Scores travel as one blob per round: magic, round (4 bytes), the number of steps (4
bytes), and per step its number (4 bytes), its number of records (4 bytes), that many
big-endian float64 norm scores, then as many cosine scores.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hospital_agent.sealed_mail import SealedMail
from medsplit.errors import MedSplitError, SealError
from medsplit.training.label_leakage import cosine_scores, leakage_auc, norm_scores

__all__ = ["LeakageScoresRefused", "RoundScores", "collect_leakage", "send_scores"]

TOPIC = "leakage"
PURPOSE = "leakage-scores"
MAGIC = b"MSLEAK1"
#: The most records one step may score (the largest batch a job allows, with margin).
MAX_STEP_RECORDS = 1 << 16


class LeakageScoresRefused(MedSplitError):
    """A passive party's scores do not fit the round they claim (a broken or hostile
    party); the message says what."""


@dataclass
class RoundScores:
    """A passive party's scores of one round, by step (a step done again after a restart
    replaces its scores; one the party missed is simply absent)."""

    round: int
    steps: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def saw(self, step: int, gradients: torch.Tensor) -> None:
        """The gradient of this party's embedding at ``step`` (records first)."""
        self.steps[step] = (norm_scores(gradients), cosine_scores(gradients))

    def to_bytes(self) -> bytes:
        parts = [MAGIC, struct.pack(">II", self.round, len(self.steps))]
        for step, (norm, cosine) in sorted(self.steps.items()):
            parts.append(struct.pack(">II", step, len(norm)))
            parts.append(norm.double().numpy().astype(">f8").tobytes())
            parts.append(cosine.double().numpy().astype(">f8").tobytes())
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes, *, round_: int, records: Mapping[int, int]) -> RoundScores:
        """The scores in ``data``, checked against the round and the number of records of
        each step the label party took (``records``, by step).

        Raises:
            LeakageScoresRefused: another round, a step the round does not have or twice,
                another number of records, a value that is not finite, or bytes past the
                end.
        """
        head = len(MAGIC) + 8
        if not data.startswith(MAGIC) or len(data) < head:
            raise LeakageScoresRefused("not a label-leakage scores blob (magic or length)")
        got_round, count = struct.unpack_from(">II", data, len(MAGIC))
        if got_round != round_ or count > len(records):
            raise LeakageScoresRefused(
                f"scores of round {got_round} with {count} steps, for round {round_} of "
                f"{len(records)} steps"
            )
        out, at = cls(round_), head
        for _ in range(count):
            if at + 8 > len(data):
                raise LeakageScoresRefused(f"scores truncated after {len(out.steps)} steps")
            step, n = struct.unpack_from(">II", data, at)
            at += 8
            if step not in records or step in out.steps:
                raise LeakageScoresRefused(
                    f"scores of step {step}: not a step of the round, or twice"
                )
            if n != records[step] or n > MAX_STEP_RECORDS or at + 16 * n > len(data):
                raise LeakageScoresRefused(
                    f"step {step}: {n} scores for its {records[step]} records (or truncated)"
                )
            read = np.frombuffer(data, dtype=">f8", count=2 * n, offset=at)
            values = torch.from_numpy(read.astype(np.float64))
            if not torch.isfinite(values).all():
                raise LeakageScoresRefused(f"step {step}: a score is not finite")
            out.steps[step] = (values[:n].clone(), values[n:].clone())
            at += 16 * n
        if at != len(data):
            raise LeakageScoresRefused(f"{len(data) - at} bytes past the scores' end")
        return out


def send_scores(mail: SealedMail, *, label_party: str, scores: RoundScores) -> None:
    """Seal this passive party's scores of a round for the label party."""
    mail.send(label_party, TOPIC, PURPOSE, scores.to_bytes(), scores.round)


def collect_leakage(
    mail: SealedMail,
    *,
    passive: Sequence[str],
    round_: int,
    labels: Mapping[int, torch.Tensor],
    timeout: float,
    stopping: threading.Event,
) -> dict[str, dict[str, Any]]:
    """At the label party: each passive party's scores of round ``round_`` against the
    labels of the steps they cover (``labels``, by step): by party, the records scored and
    each attack's AUC. A party whose scores did not come within ``timeout`` is left out.

    Raises:
        LeakageScoresRefused: a party's scores do not fit the round.
    """
    records = {step: len(y) for step, y in labels.items()}
    out: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    waiting = list(passive)
    while waiting and time.monotonic() < deadline and not stopping.is_set():
        for party in list(waiting):
            blob = mail.get(party, TOPIC)
            if blob is None:
                continue
            try:
                opened = mail.open(party, PURPOSE, blob, round_)
            except SealError:
                continue  # an older round's scores, still on the relay: wait for this one
            scores = RoundScores.from_bytes(opened, round_=round_, records=records)
            steps = sorted(scores.steps)
            truth = torch.cat([labels[s] for s in steps]) if steps else torch.empty(0)
            report: dict[str, Any] = {"records": len(truth)}
            for index, attack in enumerate(("norm", "cosine")):
                values = torch.cat([scores.steps[s][index] for s in steps]) if steps else truth
                report[f"{attack}_auc"] = leakage_auc(values, truth) if steps else None
            out[party] = report
            waiting.remove(party)
        if waiting:
            stopping.wait(0.5)
    return out
