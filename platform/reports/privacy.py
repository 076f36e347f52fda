"""The result document's privacy section: whatever privacy figures the platform holds for
a job, kept apart so that the figures a later change adds come in here only.

Two sources: the label-leakage audit a vertical job's label party reports
(:func:`training.leakage.leakage_summary`, shown to every participant as the job's API
shows it), and a selector ``privacy_figures(job, actor)`` looked for by name among
:data:`PRIVACY_SELECTORS`: the app that will hold measured privacy figures (a hospital's
own privacy audit, reported as numbers only: DESIGN.md invariant 7) provides it, and
applies the least-privilege rule itself. Where neither holds anything the section says
"not measured".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kernel.actors import Actor
from training.leakage import leakage_summary
from training.models import Job

#: Where a ``privacy_figures(job, actor)`` selector may live, first found wins. Looked up
#: by name, not imported: this app must not need one to run.
PRIVACY_SELECTORS = ("privacy.selectors", "training.selectors", "hospitals.selectors")


@dataclass(frozen=True)
class PrivacySection:
    """What the document shows of a job's privacy.

    Attributes:
        label_leakage: per round and passive party, the norm and cosine attacks' ROC AUC
            (``leakage_summary``'s rows); empty for a job without passive parties.
        figures: what ``privacy_figures(job, actor)`` returned: rows of named numbers
            (a mapping each), or empty where no such selector exists or it holds none.
        source: the module the figures came from, or "" when none was found.
    """

    label_leakage: list[dict[str, Any]]
    figures: list[dict[str, Any]]
    source: str

    @property
    def measured(self) -> bool:
        return bool(self.label_leakage or self.figures)


def privacy_figures_selector() -> tuple[Callable[..., Any], str] | None:
    """The first ``privacy_figures`` among :data:`PRIVACY_SELECTORS`, and its module."""
    for name in PRIVACY_SELECTORS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        found = getattr(module, "privacy_figures", None)
        if callable(found):
            return found, name
    return None


def privacy_section(job: Job, actor: Actor) -> PrivacySection:
    """The privacy figures ``actor`` may see of ``job``."""
    figures: list[dict[str, Any]] = []
    source = ""
    selector = privacy_figures_selector()
    if selector is not None:
        found, source = selector
        figures = _rows(found(job, actor))
    return PrivacySection(label_leakage=leakage_summary(job), figures=figures, source=source)


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
