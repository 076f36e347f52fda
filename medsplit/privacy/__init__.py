"""Privacy measurements of what crosses a cut: inversion of the activations, their
distance correlation with the inputs, and label leakage from the gradients a hospital
sends. Sits on ``training`` and ``cutting``; the hospital runs it on its own data."""

from medsplit.defenses.distance import distance_correlation, u_distance_correlation_sqr
from medsplit.privacy.audit import AuditSettings, PrivacyReport, audit_cut, check_one_tensor
from medsplit.privacy.inversion import (
    InversionDecoder,
    InversionSettings,
    image_quality,
    reconstruct,
    save_picture_grid,
    train_decoder,
)
from medsplit.privacy.leakage import GradientRecorder
from medsplit.privacy.report import format_report

__all__ = [
    "AuditSettings",
    "GradientRecorder",
    "InversionDecoder",
    "InversionSettings",
    "PrivacyReport",
    "audit_cut",
    "check_one_tensor",
    "distance_correlation",
    "format_report",
    "image_quality",
    "reconstruct",
    "save_picture_grid",
    "train_decoder",
    "u_distance_correlation_sqr",
]
