"""The privacy audit's figures as a readable table: one line per figure, with what it
means and where the published figure comes from."""

from __future__ import annotations

import json

from medsplit.privacy.audit import PrivacyReport

__all__ = ["format_report"]


def format_report(report: PrivacyReport, *, source: str) -> str:
    """The audit as a readable table, one line per figure with what it means."""
    shape = "x".join(map(str, report.activation))
    lines = [
        f"privacy audit of {report.model}, {report.mode} mode, cut {' / '.join(report.cuts)} "
        f"(activation {shape} per image), after {report.train_steps} training "
        f"step{'' if report.train_steps == 1 else 's'} on {source}",
        f"inverse network trained on {report.train_records} training images, "
        f"{report.val_records} validation images reconstructed",
        "",
    ]
    rows = [
        (
            "inversion SSIM",
            f"{report.ssim:.3f}",
            "1: the images come back; below about 0.3 unrecognisable (He et al. 2019: "
            "0.99 after the first convolution)",
        ),
        ("inversion PSNR", f"{report.psnr:.2f} dB", "higher: closer reconstructions"),
        (
            "mean image SSIM",
            f"{report.baseline_ssim:.3f}",
            f"the training images' average in place of each reconstruction (PSNR "
            f"{report.baseline_psnr:.2f} dB): what the activations add is the gap to it",
        ),
        (
            "distance correlation",
            f"{report.distance_correlation:.3f}",
            f"0: activations independent of the inputs, 1: a similarity transform of them "
            f"({report.dcor_records} images)",
        ),
    ]
    if report.label_leakage is None:
        rows.append(("label leakage", "n/a", report.label_leakage_note))
    else:
        for attack in ("norm", "cosine"):
            auc = report.label_leakage.get(f"{attack}_auc")
            strength = report.label_leakage.get(f"{attack}_strength")
            rows.append(
                (
                    f"{attack} attack AUC",
                    _figure(auc),
                    f"strength {_figure(strength)} (max(AUC, 1-AUC); 0.5 chance, 1 every label; "
                    "Li et al. 2022)",
                )
            )
    if report.epsilon is not None:
        rows.append(
            (
                "activation noise ε",
                _figure(report.epsilon["epsilon"]),
                f"the whole job at this hospital, δ = {report.epsilon['delta_total']:.2g} "
                f"(σ = {report.epsilon['noise_multiplier']:.3f}, opacus' RDP accountant)",
            )
        )
    if report.defenses:
        rows.append(("defenses", "", json.dumps(report.defenses, sort_keys=True)))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines += [f"{a.ljust(width[0])}  {b.rjust(width[1])}  {c}" for a, b, c in rows]
    if report.picture:
        lines.append(f"picture grid (originals above reconstructions): {report.picture}")
    return "\n".join(lines)


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
