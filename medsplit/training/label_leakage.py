"""How much the gradients a passive party receives say about the label party's labels.

Li et al., "Label Leakage and Protection in Two-party Split Learning", ICLR 2022: with
binary labels, the gradient of the loss at a passive party's embedding differs in norm
and in direction between the classes. A passive party computes what an attacker in its
place would (:func:`norm_scores`, :func:`cosine_scores`: a score per record, higher
meaning "class 1"); only the label party, which holds the labels, can say how good those
guesses are (:func:`leakage_auc`). No party holds both the labels and the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from monai.metrics import compute_roc_auc

__all__ = ["LeakageScores", "cosine_scores", "leakage_auc", "norm_scores"]


def _per_record(gradients: torch.Tensor) -> torch.Tensor:
    return gradients.detach().reshape(gradients.shape[0], -1).double()


def norm_scores(gradients: torch.Tensor) -> torch.Tensor:
    """The norm attack: each record's gradient norm (the rarer class gets larger ones)."""
    return _per_record(gradients).norm(dim=1)


def cosine_scores(gradients: torch.Tensor) -> torch.Tensor:
    """The cosine attack: each record's cosine similarity with a reference gradient.

    Li et al. take the gradient of one record known to be positive; an attacker without
    any label takes the batch's largest gradient (the norm attack's likeliest positive),
    as here, so the scores need nothing but what the party received.
    """
    flat = _per_record(gradients)
    reference = flat[int(flat.norm(dim=1).argmax())]
    return torch.nn.functional.cosine_similarity(flat, reference.unsqueeze(0), dim=1)


def leakage_auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """ROC AUC of ``scores`` as a guess of which ``labels`` are 1 (MONAI's
    ``compute_roc_auc``); ``None`` unless the labels are binary with both classes present
    (the attacks are defined for binary labels). 0.5 is chance; 1.0 recovers every label,
    and so does 0.0 (the attacker need only flip its guesses), so the report also gives
    ``max(auc, 1 - auc)``."""
    labels = labels.reshape(-1)
    if set(labels.unique().tolist()) != {0, 1}:
        return None
    return float(compute_roc_auc(scores.reshape(-1).double(), labels.double()))


@dataclass
class LeakageScores:
    """A round's scores from one passive party, kept with the labels at the label party."""

    norm: list[torch.Tensor] = field(default_factory=list)
    cosine: list[torch.Tensor] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)

    def add(self, gradients: torch.Tensor, labels: torch.Tensor) -> None:
        """One step: the scores of what the party received, beside the batch's labels."""
        self.norm.append(norm_scores(gradients))
        self.cosine.append(cosine_scores(gradients))
        self.labels.append(labels.reshape(-1))

    def report(self) -> dict[str, float | None]:
        """Each attack's AUC over the round and its strength ``max(auc, 1 - auc)``."""
        if not self.labels:
            return {}
        labels = torch.cat(self.labels)
        out: dict[str, float | None] = {}
        for attack, scores in (("norm", self.norm), ("cosine", self.cosine)):
            auc = leakage_auc(torch.cat(scores), labels)
            out[f"{attack}_auc"] = auc
            out[f"{attack}_strength"] = None if auc is None else max(auc, 1.0 - auc)
        return out
