"""``medsplit-agent privacy-audit``: the hospital audits a cut on its own data, on demand.

The split trains briefly on the hospital's training split (a one-hospital job of the
mode, in this process); an inverse network learns from that split's (image, activation)
pairs and reconstructs its validation split; the distance correlation and, where labels
stay here, the label-leakage attacks' AUC complete the figures
(:func:`medsplit.privacy.audit_cut`). The figures and the picture grid are written to
the work directory (``privacy/``, readable by the agent's user only) and nothing is sent:
the picture never leaves the hospital (invariant 7).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hospital_agent.config import AgentConfig
from hospital_agent.data import load_local, prepare
from hospital_agent.turns import MODEL_MODULES_SETTING
from medsplit.errors import ConfigError
from medsplit.models import get_model_spec, is_factory_name, set_model_modules
from medsplit.modes import DEFAULT_MODE, get_mode
from medsplit.privacy import AuditSettings, InversionSettings, PrivacyReport, audit_cut
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.config import TrainingConfig
from medsplit.training.setup import JobModel

#: The work directory's folder for audits.
AUDIT_DIR = "privacy"


@dataclass(frozen=True)
class AuditRequest:
    """What the officer asks for on the command line."""

    model: str
    cuts: tuple[str, ...] = ()
    mode: str = DEFAULT_MODE
    input_shape: tuple[int, ...] | None = None
    num_classes: int = 2
    train_steps: int = 100
    decoder_steps: int = 300
    batch_size: int = 32
    seed: int = 0


@dataclass(frozen=True)
class AuditOutcome:
    """The figures and where they were written."""

    report: PrivacyReport
    figures: Path
    picture: Path


def run_privacy_audit(config: AgentConfig, request: AuditRequest) -> AuditOutcome:
    """Audit ``request``'s model and cut on this hospital's configured data.

    Raises:
        DataProblem: the data cannot be read or does not fit the model.
        ConfigError, CutError: a bad model, mode or cut (several tensors crossing, say).
    """
    set_model_modules(config.model_modules, setting=MODEL_MODULES_SETTING)
    data, _ = load_local(
        config.data,
        input_shape=request.input_shape,
        num_classes=request.num_classes,
        val_fraction=config.val_fraction,
        seed=config.split_seed,
    )
    shape = request.input_shape or tuple(data.train.images.shape[1:])
    data = prepare(data, input_shape=shape, num_classes=request.num_classes)
    model = JobModel(
        name=request.model,
        spatial_dims=len(shape) - 1,
        in_channels=shape[0],
        num_classes=request.num_classes,
        input_shape=shape,
        seed=request.seed,
    ).build()
    if request.cuts:
        cuts = request.cuts
    elif is_factory_name(request.model):
        raise ConfigError(f"{request.model} has no default cut: give --cut")
    else:
        cuts = get_mode(request.mode).default_cuts(get_model_spec(request.model))
    optimizer = OptimizerConfig(name="adam", lr=0.002)
    training = TrainingConfig(
        cuts=tuple(cuts),
        mode=request.mode,
        client_optimizer=optimizer,
        server_optimizer=optimizer,
        batch_size=request.batch_size,
        seed=request.seed,
    )
    folder = Path(config.work_dir) / AUDIT_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # mkdir's mode is cut by the umask, and an old folder keeps its own
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{request.model}-{request.mode}-{'+'.join(cuts)}")
    picture = folder / f"{stem}.png"
    settings = AuditSettings(
        train_steps=request.train_steps,
        inversion=InversionSettings(steps=request.decoder_steps, seed=request.seed),
        picture=picture,
    )
    report = audit_cut(model, data.train, data.val, training, settings, model_name=request.model)
    figures = folder / f"{stem}.json"
    figures.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return AuditOutcome(report=report, figures=figures, picture=picture)
