"""A job's privacy options: what each hospital measures and which defenses it applies.

One JSON object in the job description (``JobDescription.privacy``), every part off by
default, each part an object of its own settings::

    {
      "activation_noise": {"clip_norm": 1.0, "noise_multiplier": 1.1, "delta": 1e-5},
      "nopeek": {"weight": 0.5},
      "label_noise": {"epsilon": 2.0},
      "gradient_noise": {"scale": 0.5},
      "audit": {"every_rounds": 1},
      "hijack_detection": {"method": "splitout"}
    }

(``{"method": "splitguard", "probe_probability": 0.1}`` for SplitGuard, vanilla only.)

- ``activation_noise``: the Gaussian mechanism on what a hospital's front sends, each
  sample clipped to ``clip_norm`` first, batches drawn by Poisson sampling, ε accounted
  over the whole job at ``delta``; ``target_epsilon`` instead of ``noise_multiplier``
  asks for the noise that spends that ε.
- ``nopeek``: a distance-correlation term between the inputs and the activations, with
  its ``weight``, added to the front's backward pass at the hospital (Vepakomma et al.).
- ``label_noise``: randomised response on the labels that travel (labels at the server),
  label-DP at ``epsilon``.
- ``gradient_noise``: Gaussian noise whose norm per sample is about ``scale`` times the
  batch's mean per-sample gradient norm, on the gradients a hospital holding the labels
  sends up, against the norm and cosine attacks (after Li et al.'s Marvell).
- ``audit``: each hospital audits its own exposure (inversion, distance correlation,
  label leakage) every ``every_rounds`` rounds and reports the numbers.
- ``hijack_detection``: each hospital checks the gradients it receives for a hijacking
  server and stops taking part when it finds one (SplitOut in any mode but vertical;
  SplitGuard's fake-label batches in vanilla mode, which the server trains on: a job
  with SplitGuard on is not exact).

The defenses change what crosses the cut, so a job with any of them is not exact against
unsplit training (invariant 1 holds with all off); its noise is drawn from generators
seeded per step, so two runs of the same job give the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from medsplit.errors import ConfigError

__all__ = [
    "ActivationNoise",
    "GradientNoise",
    "HijackDetection",
    "LabelNoise",
    "NoPeek",
    "PrivacyAudit",
    "PrivacyOptions",
    "PrivacyOptionsError",
    "privacy_problems",
]

#: The most rounds between two audits (a job has at most this many rounds in practice).
MAX_AUDIT_INTERVAL = 10_000
#: Detection methods and what each needs of the mode.
HIJACK_METHODS = ("splitout", "splitguard")


#: Why a mode whose parties hold different features of a record takes no activation noise.
VERTICAL_ACTIVATION_NOISE = (
    "activation_noise is not available in a mode whose parties hold different features of "
    "the same records: its accounting needs each party's own Poisson sampling, and the "
    "parties' batches must be the same records (NoPeek and gradient_noise work in this mode)"
)


class PrivacyOptionsError(ConfigError):
    """Privacy options that cannot be used.

    Attributes:
        reasons: every problem found, one sentence each, naming the setting.
    """

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("privacy: " + " / ".join(self.reasons))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Part:
    """One part of the options: a frozen dataclass with a JSON object form."""

    key: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def problems(self) -> list[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class ActivationNoise(_Part):
    """The Gaussian mechanism on the front's outputs, with per-sample clipping.

    Attributes:
        clip_norm: every sample's activations (all tensors crossing the cut, as one
            vector) are scaled down to at most this L2 norm.
        noise_multiplier: the noise's standard deviation over ``clip_norm``; ``None``:
            found from ``target_epsilon``.
        target_epsilon: the ε the job may spend at each hospital; ``None``: not fixed
            (``noise_multiplier`` is then required).
        delta: the δ of the (ε, δ) guarantee.
    """

    key: ClassVar[str] = "activation_noise"
    clip_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5

    def problems(self) -> list[str]:
        out = []
        if not _number(self.clip_norm) or not 0 < self.clip_norm < math.inf:
            out.append(f"activation_noise.clip_norm must be a number > 0, got {self.clip_norm!r}")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            out.append(
                "activation_noise takes exactly one of noise_multiplier (the noise) and "
                "target_epsilon (the ε to spend, the noise found from it)"
            )
        if self.noise_multiplier is not None and (
            not _number(self.noise_multiplier) or not 0 < self.noise_multiplier <= 1000
        ):
            out.append(
                "activation_noise.noise_multiplier must be a number in (0, 1000], "
                f"got {self.noise_multiplier!r}"
            )
        if self.target_epsilon is not None and (
            not _number(self.target_epsilon) or not 0 < self.target_epsilon <= 1000
        ):
            out.append(
                "activation_noise.target_epsilon must be a number in (0, 1000], "
                f"got {self.target_epsilon!r}"
            )
        if not _number(self.delta) or not 0 < self.delta < 1:
            out.append(f"activation_noise.delta must be a number in (0, 1), got {self.delta!r}")
        return out


@dataclass(frozen=True)
class NoPeek(_Part):
    """The distance-correlation term of NoPeek, added at the hospital.

    Attributes:
        weight: the term's weight against the task's loss.
    """

    key: ClassVar[str] = "nopeek"
    weight: float = 0.1

    def problems(self) -> list[str]:
        if not _number(self.weight) or not 0 < self.weight <= 1000:
            return [f"nopeek.weight must be a number in (0, 1000], got {self.weight!r}"]
        return []


@dataclass(frozen=True)
class LabelNoise(_Part):
    """Randomised response on the labels a hospital sends (label-DP at ``epsilon``).

    Attributes:
        epsilon: each label is kept with probability e^ε / (e^ε + K - 1) and otherwise
            replaced by one of the K - 1 other classes, uniformly.
    """

    key: ClassVar[str] = "label_noise"
    epsilon: float = 2.0

    def problems(self) -> list[str]:
        if not _number(self.epsilon) or not 0 < self.epsilon <= 100:
            return [f"label_noise.epsilon must be a number in (0, 100], got {self.epsilon!r}"]
        return []


@dataclass(frozen=True)
class GradientNoise(_Part):
    """Noise on the gradients a hospital holding the labels sends up.

    Attributes:
        scale: the noise's size against the batch's mean per-sample gradient norm m:
            each value gets N(0, (scale·m/√d)²), d the values per sample, so a sample's
            noise has a norm of about scale·m (0.5: half the typical gradient's norm).
    """

    key: ClassVar[str] = "gradient_noise"
    scale: float = 0.5

    def problems(self) -> list[str]:
        if not _number(self.scale) or not 0 < self.scale <= 1000:
            return [f"gradient_noise.scale must be a number in (0, 1000], got {self.scale!r}"]
        return []


@dataclass(frozen=True)
class PrivacyAudit(_Part):
    """Each hospital's audit of its own exposure during the job.

    Attributes:
        every_rounds: audit at the end of the hospital's turn every this many rounds
            (and always after its last one).
        decoder_steps: the inverse network's training steps.
        records: the most training (and validation) records the audit uses.
    """

    key: ClassVar[str] = "audit"
    every_rounds: int = 1
    decoder_steps: int = 300
    records: int = 1024

    def problems(self) -> list[str]:
        out = []
        if not _integer(self.every_rounds) or not 1 <= self.every_rounds <= MAX_AUDIT_INTERVAL:
            out.append(
                f"audit.every_rounds must be an integer in [1, {MAX_AUDIT_INTERVAL}], "
                f"got {self.every_rounds!r}"
            )
        if not _integer(self.decoder_steps) or not 1 <= self.decoder_steps <= 100_000:
            out.append(
                f"audit.decoder_steps must be an integer in [1, 100000], got {self.decoder_steps!r}"
            )
        if not _integer(self.records) or not 16 <= self.records <= 100_000:
            out.append(f"audit.records must be an integer in [16, 100000], got {self.records!r}")
        return out


@dataclass(frozen=True)
class HijackDetection(_Part):
    """Each hospital's check of the gradients it receives for a hijacking server.

    Attributes:
        method: ``splitout``, an outlier detector fitted on gradients the hospital
            simulates honestly on a share of its own data (any mode but vertical).
            ``splitguard``, SplitGuard's fake-label probes (vanilla mode only: the fake
            labels must travel to the server; the server trains on the fake batches, so
            the job is not exact while it is on).
        honest_records: the records of its own training split the hospital simulates
            honest training on (``splitout``).
        simulated_epochs: passes of the honest simulation over ``honest_records``; its
            steps' gradients are the detector's honest points (``splitout``).
        neighbours: the outlier detector's neighbours; ``None``: all the honest points
            but one, as SplitOut does (``splitout``).
        window, outliers: the hospital stops when ``outliers`` of the server's last
            ``window`` gradient frames are outliers (``splitout``).
        probe_probability: the chance that a training step sends a fake batch, drawn from
            the job's seed, round and step (``splitguard``).
        start_step: the first step of a turn that may be a fake batch (``splitguard``).
        min_probes: the fake batches seen before any decision (``splitguard``).
        threshold: the hospital stops when SplitGuard's score falls below it
            (``splitguard``; near 1 honest, near 0 hijacked).
        power: the score's exponent (``splitguard``; the paper's N).
    """

    key: ClassVar[str] = "hijack_detection"
    method: str = "splitout"
    honest_records: int = 256
    simulated_epochs: int = 3
    neighbours: int | None = None
    window: int = 5
    outliers: int = 3
    probe_probability: float = 0.1
    start_step: int = 2
    min_probes: int = 3
    threshold: float = 0.3
    power: float = 1.0

    def problems(self) -> list[str]:
        out = []
        # 0 would never probe (SplitGuard on, checking nothing); 1 would fake every batch
        # from start_step on, so the hospital's front would never train and no regular
        # gradient would come to compare the fake ones with.
        if not _number(self.probe_probability) or not 0 < self.probe_probability < 1:
            out.append(
                "hijack_detection.probe_probability must be a number in (0, 1), "
                f"got {self.probe_probability!r}"
            )
        if not _integer(self.start_step) or not 0 <= self.start_step <= 100_000:
            out.append(
                "hijack_detection.start_step must be an integer in [0, 100000], "
                f"got {self.start_step!r}"
            )
        if not _integer(self.min_probes) or not 1 <= self.min_probes <= 1000:
            out.append(
                "hijack_detection.min_probes must be an integer in [1, 1000], "
                f"got {self.min_probes!r}"
            )
        if not _number(self.threshold) or not 0 < self.threshold < 1:
            out.append(
                f"hijack_detection.threshold must be a number in (0, 1), got {self.threshold!r}"
            )
        if not _number(self.power) or not 0 < self.power <= 100:
            out.append(f"hijack_detection.power must be a number in (0, 100], got {self.power!r}")
        if not _integer(self.simulated_epochs) or not 1 <= self.simulated_epochs <= 100:
            out.append(
                "hijack_detection.simulated_epochs must be an integer in [1, 100], "
                f"got {self.simulated_epochs!r}"
            )
        if self.neighbours is not None and (
            not _integer(self.neighbours) or not 1 <= self.neighbours <= 10_000
        ):
            out.append(
                "hijack_detection.neighbours must be an integer in [1, 10000] or null, "
                f"got {self.neighbours!r}"
            )
        if not _integer(self.window) or not 1 <= self.window <= 1000:
            out.append(
                f"hijack_detection.window must be an integer in [1, 1000], got {self.window!r}"
            )
        elif not _integer(self.outliers) or not 1 <= self.outliers <= self.window:
            out.append(
                f"hijack_detection.outliers must be an integer in [1, window={self.window}], "
                f"got {self.outliers!r}"
            )
        if self.method not in HIJACK_METHODS:
            out.append(
                f"hijack_detection.method must be one of {', '.join(HIJACK_METHODS)}, "
                f"got {self.method!r}"
            )
        if not _integer(self.honest_records) or not 16 <= self.honest_records <= 100_000:
            out.append(
                "hijack_detection.honest_records must be an integer in [16, 100000], "
                f"got {self.honest_records!r}"
            )
        return out


_PARTS: dict[str, type[_Part]] = {
    part.key: part
    for part in (ActivationNoise, NoPeek, LabelNoise, GradientNoise, PrivacyAudit, HijackDetection)
}


@dataclass(frozen=True)
class PrivacyOptions:
    """Which measurements and defenses a job runs at its hospitals; all off by default."""

    activation_noise: ActivationNoise | None = None
    nopeek: NoPeek | None = None
    label_noise: LabelNoise | None = None
    gradient_noise: GradientNoise | None = None
    audit: PrivacyAudit | None = None
    hijack_detection: HijackDetection | None = None

    def __post_init__(self) -> None:
        reasons = []
        for key, kind in _PARTS.items():
            part = getattr(self, key)
            if part is None:
                continue
            if not isinstance(part, kind):
                reasons.append(f"{key} must be a {kind.__name__}, got {part!r}")
            else:
                reasons.extend(part.problems())
        if reasons:
            raise PrivacyOptionsError(reasons)

    @property
    def defended(self) -> bool:
        """Whether any defense changes what crosses the cut (so the job is not exact).

        SplitGuard's fake-label batches do (the server trains on them); SplitOut does not.
        """
        splitguard = self.hijack_detection is not None and (
            self.hijack_detection.method == "splitguard"
        )
        return any(
            (
                self.activation_noise,
                self.nopeek,
                self.label_noise,
                self.gradient_noise,
                splitguard,
            )
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form: only the parts that are on."""
        return {key: getattr(self, key).to_json() for key in _PARTS if getattr(self, key)}

    @classmethod
    def from_json(cls, data: object) -> PrivacyOptions:
        """Options from their JSON form, strictly (no unknown part or setting).

        Raises:
            PrivacyOptionsError: every problem, each naming its setting.
        """
        options, reasons = _read(data)
        if reasons:
            raise PrivacyOptionsError(reasons)
        assert options is not None
        return options


def _read(data: object) -> tuple[PrivacyOptions | None, list[str]]:
    if not isinstance(data, Mapping):
        return None, [f"privacy must be a JSON object, got {data!r}"]
    reasons: list[str] = []
    parts: dict[str, _Part] = {}
    for key, value in data.items():
        kind = _PARTS.get(key) if isinstance(key, str) else None
        if kind is None:
            reasons.append(f"unknown part {key!r}; known parts: {', '.join(_PARTS)}")
            continue
        if not isinstance(value, Mapping):
            reasons.append(f"{key} must be a JSON object of its settings, got {value!r}")
            continue
        known = [f.name for f in fields(kind)]  # type: ignore[arg-type]
        unknown = [k for k in value if k not in known]
        if unknown:
            reasons.append(
                f"{key} has no setting {', '.join(map(repr, unknown))} "
                f"(it takes {', '.join(known)})"
            )
            continue
        part = kind(**value)
        problems = part.problems()
        if problems:
            reasons.extend(problems)
        else:
            parts[key] = part
    if reasons:
        return None, reasons
    return PrivacyOptions(**parts), []  # type: ignore[arg-type]


def privacy_problems(
    data: object,
    *,
    labels_at_server: bool | None,
    feature_sets: bool = False,
    label_probes: bool | None = None,
) -> tuple[PrivacyOptions | None, list[str]]:
    """The options read from ``data`` and every reason they do not fit the job's mode.

    Args:
        labels_at_server: whether the mode sends the labels to the server (``None``: the
            mode is not known yet, so the mode's rules are skipped).
        feature_sets: whether the mode's parties hold different features of a record.
        label_probes: whether the mode takes SplitGuard's fake-label probes (vanilla's
            ``SplitMode.label_probes``), when known.
    """
    options, reasons = _read(data)
    if options is None or labels_at_server is None:
        return options, reasons
    if options.label_noise and not labels_at_server:
        reasons.append(
            "label_noise protects labels that travel to the server; in this mode they stay "
            "at a hospital (gradient_noise protects them from what its gradients reveal)"
        )
    if options.gradient_noise and labels_at_server:
        reasons.append(
            "gradient_noise protects the labels a hospital keeps; in this mode they travel "
            "to the server (label_noise randomises them)"
        )
    if feature_sets and options.activation_noise:
        reasons.append(VERTICAL_ACTIVATION_NOISE)
    if feature_sets and options.hijack_detection:
        reasons.append(
            "hijack_detection is not available in a mode whose parties hold different "
            "features of the same records: a party's front is not the model's first "
            "segment, so it cannot simulate honest training of the rest"
        )
    detection = options.hijack_detection
    if (
        detection is not None
        and detection.method == "splitguard"
        and not feature_sets
        and (not labels_at_server or label_probes is False)
    ):
        reasons.append(
            "hijack_detection method splitguard is available in vanilla mode only: its "
            "fake-label batches need the labels to travel to the server with the "
            "activations, the whole rest of the model there (this mode does not; use "
            "method splitout)"
        )
    return (None if reasons else options), reasons
