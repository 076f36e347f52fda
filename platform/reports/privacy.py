"""The result document's privacy section: the privacy figures the platform holds for a
job, kept apart so that figures a later change adds come in here only.

Two sources: the label-leakage audit a vertical job's label party reports
(:func:`training.leakage.leakage_summary`, shown to every participant as the job's API
shows it), and the figures each hospital's own privacy audit reports as numbers
(:func:`training.selectors.privacy_figures`, which applies the least-privilege rule
itself; DESIGN.md invariant 7). Where neither holds anything the section says "not
measured".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel.actors import Actor
from training.leakage import leakage_summary
from training.models import Job
from training.selectors import privacy_figures


@dataclass(frozen=True)
class PrivacySection:
    """What the document shows of a job's privacy.

    Attributes:
        label_leakage: per round and passive party, the norm and cosine attacks' ROC AUC
            (``leakage_summary``'s rows); empty for a job without passive parties.
        figures: each hospital's reported figures per round that the reader may see
            (``privacy_figures``' rows); empty where none were reported.
    """

    label_leakage: list[dict[str, Any]]
    figures: list[dict[str, Any]]

    @property
    def measured(self) -> bool:
        return bool(self.label_leakage or self.figures)


def privacy_section(job: Job, actor: Actor) -> PrivacySection:
    """The privacy figures ``actor`` may see of ``job``."""
    return PrivacySection(
        label_leakage=leakage_summary(job), figures=_rows(privacy_figures(job, actor))
    )


def _rows(answer: Any) -> list[dict[str, Any]]:
    """A selector's answer as rows: a list of mappings as it is; a mapping of names to
    mappings (or to numbers) one row per name."""
    if not answer:
        return []
    if isinstance(answer, Mapping):
        return [
            {"name": name, **value}
            if isinstance(value, Mapping)
            else {"name": name, "value": value}
            for name, value in answer.items()
        ]
    return [dict(row) for row in answer]
