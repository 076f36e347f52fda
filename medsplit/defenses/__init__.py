"""Privacy defenses a hospital applies to what crosses the cut, and the job options that
turn them on (:mod:`medsplit.defenses.options`). Sits below ``training``: the in-process
jobs and both sides of a turn apply them; the measurements (:mod:`medsplit.privacy`)
sit above."""

from medsplit.defenses.accounting import Spent, epsilon_spent, noise_for_target
from medsplit.defenses.options import (
    ActivationNoise,
    GradientNoise,
    HijackDetection,
    LabelNoise,
    NoPeek,
    PrivacyAudit,
    PrivacyOptions,
    PrivacyOptionsError,
    privacy_problems,
)

__all__ = [
    "ActivationNoise",
    "GradientNoise",
    "HijackDetection",
    "LabelNoise",
    "NoPeek",
    "PrivacyAudit",
    "PrivacyOptions",
    "PrivacyOptionsError",
    "Spent",
    "epsilon_spent",
    "noise_for_target",
    "privacy_problems",
]
