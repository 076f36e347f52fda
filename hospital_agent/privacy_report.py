"""The per-turn privacy audit: each hospital measures its own exposure during a job.

With a job's ``privacy.audit`` on, at the end of this hospital's turn every
``every_rounds`` rounds (and after its last round), the agent audits the job's front as
it stands after the turn, on its own data (:func:`medsplit.privacy.audit.audit_front`):
an inverse network learns from its training split's (image, activation) pairs and
rebuilds its validation split (SSIM, PSNR), and the distance correlation of inputs and
activations follows. Where its labels stay here (U-shaped), the gradients it sent up in
the turn are scored by the norm and cosine attacks against its labels (Li et al.). With
``privacy.activation_noise`` on, it also tells the ε spent so far, after every turn.

The picture grid (originals above reconstructions) and the figures go to the work
directory (``privacy/job-N/``, readable by the agent's user only); only the numbers go
to the coordinator (invariant 7).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hospital_agent.coordinator import Coordinator
from hospital_agent.data import LocalData
from medsplit.cutting import SplitModel
from medsplit.defenses import PrivacyOptions
from medsplit.defenses.accounting import Spent
from medsplit.defenses.client import DefendedClient
from medsplit.modes import Side
from medsplit.privacy.audit import AuditSettings, audit_front, check_one_tensor
from medsplit.privacy.inversion import InversionSettings
from medsplit.privacy.leakage import GradientRecorder
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.label_leakage import LeakageScores
from medsplit.turns import TurnClient

__all__ = ["AUDIT_DIR", "ScoredTurnClient", "TurnPrivacy", "audit_due", "report_figures"]

logger = logging.getLogger(__name__)

#: The work directory's folder for audits (the on-demand audit's too).
AUDIT_DIR = "privacy"
#: The most records the distance correlation uses: its cost grows with their square.
DCOR_RECORDS = 512
#: The PSNR reported for an exact reconstruction (infinite), as the coordinator's range
#: ends (``training/privacy.py``).
MAX_PSNR = 200.0


def audit_due(options: PrivacyOptions, *, round_index: int, rounds: int) -> bool:
    """Whether this hospital audits after its turn of ``round_index``: every
    ``every_rounds`` rounds, and after the job's last round."""
    if options.audit is None:
        return False
    return (round_index + 1) % options.audit.every_rounds == 0 or round_index == rounds - 1


@dataclass
class TurnPrivacy:
    """One turn's privacy measurements at this hospital (see the module docstring)."""

    job: int
    round_index: int
    options: PrivacyOptions
    config: TrainingConfig
    split: SplitModel
    work_dir: Path
    audit: bool
    scores: LeakageScores | None = None

    @classmethod
    def for_turn(
        cls,
        *,
        job: int,
        round_index: int,
        rounds: int,
        options: PrivacyOptions,
        config: TrainingConfig,
        split: SplitModel,
        work_dir: Path,
    ) -> TurnPrivacy | None:
        """What this turn measures; ``None``: nothing (no audit due, no noise)."""
        audit = audit_due(options, round_index=round_index, rounds=rounds)
        if not audit and options.activation_noise is None:
            return None
        mode = config.split_mode
        scored = audit and mode.labels is Side.HOSPITAL and config.task == "classification"
        return cls(
            job=job,
            round_index=round_index,
            options=options,
            config=config,
            split=split,
            work_dir=work_dir,
            audit=audit,
            scores=LeakageScores() if scored else None,
        )

    def turn_client(self, **kwargs: Any) -> TurnClient:
        """The turn's client: where the gradients sent up are scored, one that scores
        what it sends, as it leaves (after the job's defenses, gradient noise included)."""
        if self.scores is None:
            return TurnClient(**kwargs)
        return ScoredTurnClient(scores=self.scores, **kwargs)

    def figures(
        self, parties: dict[str, Party], data: LocalData, *, spent: Spent | None
    ) -> dict[str, Any]:
        """The turn's figures, the picture grid written to the work directory.

        Args:
            parties: this hospital's parties as the turn left them.
            spent: what the activation noise spent so far (its accounting), if on.
        """
        out: dict[str, Any] = {}
        if self.audit:
            out.update(self._inversion(parties, data))
            if self.scores is not None and self.scores.labels:
                found = self.scores.report()
                out.update(
                    label_records=sum(len(y) for y in self.scores.labels),
                    norm_auc=found.get("norm_auc"),
                    cosine_auc=found.get("cosine_auc"),
                )
        if self.options.activation_noise is not None and spent is not None:
            out.update(
                epsilon=float(spent.epsilon),
                # Past 1 a δ says nothing; the coordinator takes at most 1.
                delta_total=min(float(spent.delta_total), 1.0),
                noise_multiplier=float(spent.noise_multiplier),
            )
        if out:
            folder = self.folder()
            stem = folder / f"round-{self.round_index}"
            stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
        return out

    def folder(self) -> Path:
        """``privacy/job-N/`` in the work directory, for the agent's user only."""
        folder = self.work_dir / AUDIT_DIR / f"job-{self.job}"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for part in (folder.parent, folder):  # mkdir's mode is cut by the umask
            os.chmod(part, 0o700)
        return folder

    def _inversion(self, parties: dict[str, Party], data: LocalData) -> dict[str, Any]:
        check_one_tensor(self.split)  # an inverse network takes one tensor
        mode = self.config.split_mode
        front_name = next(n for n, i in mode.client_segments().items() if i == 0)
        # A copy on the CPU, with the data: the job's own front is left as it is.
        front = copy.deepcopy(parties[front_name].module).cpu()
        records = self.options.audit.records if self.options.audit else 1024
        settings = AuditSettings(
            train_steps=0,
            inversion=InversionSettings(
                steps=self.options.audit.decoder_steps if self.options.audit else 300,
                seed=self.config.seed,
            ),
            dcor_records=max(2, min(records, DCOR_RECORDS)),
            max_train_records=records,
            max_val_records=records,
            picture=self.folder() / f"round-{self.round_index}.png",
        )
        found = audit_front(front, data.train, data.val, settings)
        return {
            "ssim": found.ssim,
            "psnr": min(found.psnr, MAX_PSNR) if not math.isnan(found.psnr) else found.psnr,
            "baseline_ssim": found.baseline_ssim,
            "baseline_psnr": min(found.baseline_psnr, MAX_PSNR),
            "distance_correlation": found.distance_correlation,
            "train_records": found.train_records,
            "val_records": found.val_records,
        }


class ScoredTurnClient(TurnClient):
    """A :class:`TurnClient` whose step role, as built with the job's defenses, is
    wrapped in a :class:`GradientRecorder`: the label-shaped frames are scored as they
    are sent, noise and all, so the figures are of what the server actually received."""

    def __init__(self, *, scores: LeakageScores, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scores = scores

    def _restore(self, step: int) -> None:
        # The role is (re)built here, at the start and after a restart: wrap each one.
        super()._restore(step)
        assert self.role is not None
        self.role = GradientRecorder(self.role, self.scores)

    def spent(self) -> Spent | None:
        inner = self.role.inner if isinstance(self.role, GradientRecorder) else self.role
        return inner.spent() if isinstance(inner, DefendedClient) else None


def report_figures(
    coordinator: Coordinator, *, job: int, round_index: int, figures: dict[str, Any]
) -> None:
    """Send the numbers (and nothing else) to the coordinator."""
    coordinator.report_privacy(job=job, round_index=round_index, figures=figures)
