"""``medsplit-agent predict --job N PATH…``: a completed job's final model predicting on
this hospital's images, through the split.

The images are read and fitted as training read a folder of images
(:func:`hospital_agent.data.transforms.load_for_prediction`: MONAI's readers, intensities
in [0, 1], resized to the job's input shape), all of them before anything is asked. The
front (and, U-shaped, the head) run here from the job's final weights as this agent kept
them (``jobs/job-N/final.safetensors``); the coordinator accepts the request
(``training/inference.py``: a participant, a completed job, not vertical) and a worker
serves the server segment over the relay (:mod:`medsplit.turns.inference`), with the
job's activation noise applied here as in training. The predictions are written at the
end, atomically: a CSV of the path, the predicted class and each class's probability
(softmax of the logits); for a segmentation job, also one PNG mask per image (the class
of each pixel) beside it, a 2-D job's only. Nothing is written when anything fails.

A vertical job predicts on record identifiers, not images: ``medsplit-agent predict
--job N --ids FILE`` at the job's label party (the first participant: what is predicted
is its label; another party is refused, told which). FILE holds one identifier per
line, in its first comma-separated column, no header; blank lines are skipped and a
repeated identifier counts once. Every requested identifier must be among this party's
vertical records (its training source, and its test source where configured), else
nothing is asked. The coordinator refuses at once when a party's agent is offline
(``training/vertical_prediction.py``); otherwise every other party's agent answers from
all of its vertical records, the parties align by PSI (which reveals only the
intersection) and the logits come back here (:mod:`hospital_agent.vertical_eval`). The
CSV lists every requested identifier in the file's order: ``identifier, status,
predicted, p_0..`` with status ``predicted``, or ``not held by every party`` and no
prediction.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hospital_agent.alignment import prediction_stage
from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import Backoff, Coordinator, CoordinatorError
from hospital_agent.data.transforms import load_for_job, load_for_prediction
from hospital_agent.identity import (
    Credentials,
    load_credentials,
    load_or_create_identity,
    write_private,
)
from hospital_agent.relay import Relay
from hospital_agent.service import use_deterministic_kernels
from hospital_agent.turns import (
    EXTRA_MODES_SETTING,
    MODEL_MODULES_SETTING,
    VERTICAL_PASS_FAILURES,
    Assignment,
    TurnTaker,
    job_folder,
)
from hospital_agent.vertical_eval import prediction_records, vertical_pass
from medsplit.errors import ConfigError, MedSplitError
from medsplit.models import require_model_module, set_model_modules
from medsplit.modes import load_extra_modes, mode_paths, require_mode
from medsplit.protocol.handoff import import_parties
from medsplit.training.defended import activation_account
from medsplit.training.setup import client_parties, hospital_segments, hospital_split
from medsplit.training.tasks import SEGMENTATION, get_task
from medsplit.training.vertical_parts import participants_in_order
from medsplit.turns import TurnIds
from medsplit.turns.inference import inference_limits, predict_through

__all__ = [
    "NOT_HELD",
    "PredictProblem",
    "PredictRequest",
    "Predictions",
    "predict",
    "read_identifiers",
]

#: The status of a requested record that some party does not hold (no prediction).
NOT_HELD = "not held by every party"
PREDICTED = "predicted"


class PredictProblem(MedSplitError):
    """A prediction cannot be made (not enrolled, no final weights, a 2-D-only output)."""


@dataclass(frozen=True)
class PredictRequest:
    """What ``medsplit-agent predict`` was asked: the job, the images, where to write."""

    job: int
    paths: tuple[str, ...] = ()
    out: Path | None = None
    #: a vertical job's: the file of record identifiers to predict on.
    ids: Path | None = None


@dataclass(frozen=True)
class Predictions:
    """What was written: the CSV, the masks' folder (segmentation), the request's id."""

    csv: Path
    masks: Path | None
    request: int
    samples: int


def predict(config: AgentConfig, request: PredictRequest) -> Predictions:
    """Predict on ``request.paths`` through job ``request.job``'s final model.

    Raises:
        DataProblem: an image cannot be read or does not fit the job (naming it).
        PredictProblem, ConfigError: see the class; CoordinatorRefused: the coordinator
            refused the request (not a participant, not completed, vertical, too many).
        InferenceFailed, FrameRejected: the server stopped it, or sent what fails a check.
    """
    credentials = load_credentials(config.work_dir)
    if credentials is None:
        raise PredictProblem(f"this agent is not enrolled (no credentials in {config.work_dir})")
    use_deterministic_kernels(config.deterministic)  # as the agent's turns ran
    load_extra_modes(mode_paths(config.extra_modes))
    set_model_modules(config.model_modules, setting=MODEL_MODULES_SETTING)
    coordinator = Coordinator(
        config.coordinator_url,
        token=credentials.token,
        ca_bundle=config.ca_bundle,
        backoff=Backoff(give_up_after=60.0),
    )
    assignment = Assignment(coordinator.assignment(request.job))
    require_mode(assignment.mode, setting=EXTRA_MODES_SETTING)
    description = assignment.description()
    require_model_module(description.model)
    model, job_config = assignment.model(), assignment.config()
    if job_config.split_mode.feature_sets:
        if request.ids is None:
            raise ConfigError(
                f"job {request.job} is vertical: it predicts on record identifiers "
                "(predict --job N --ids FILE), not on image paths"
            )
        return _predict_vertical(config, request, credentials, coordinator, assignment)
    if request.ids is not None:
        raise ConfigError(f"job {request.job} is not vertical: predict on image PATHs, not --ids")
    segmentation = get_task(job_config.task).name == SEGMENTATION
    if segmentation and len(model.input_shape) != 3:
        raise PredictProblem("masks are written for 2-D segmentation jobs only")
    final = job_folder(config.work_dir, request.job) / "final.safetensors"
    if not final.exists():
        raise PredictProblem(
            f"no final weights of job {request.job} in {final.parent}: this agent keeps "
            "them once the job completes (run it until then)"
        )
    images = load_for_prediction(request.paths, input_shape=tuple(model.input_shape))
    split = hospital_split(model, job_config.cuts, hospital_segments(job_config))
    parties = client_parties(split, job_config)
    import_parties(final.read_bytes(), parties)
    noise = None
    if job_config.privacy.activation_noise is not None:
        # The noise the job's training used here (it depends on the training records).
        train = load_for_job(
            config.data,
            input_shape=tuple(model.input_shape),
            num_classes=model.num_classes,
            task=job_config.task,
            val_fraction=config.val_fraction,
            seed=config.split_seed,
        )[0].train
        account = activation_account(job_config, len(train), round_=0)
        noise = account.noise_multiplier if account is not None else None
    asked = coordinator.request_inference(job=request.job, samples=len(images))
    label_shape = tuple(description.label_shape)
    limits = inference_limits(
        serving_batch=int(asked["serving_batch"]),
        samples=len(images),
        num_classes=model.num_classes,
        label_shape=label_shape,
    )
    relay = Relay(credentials, timeout=config.reply_timeout, ca_bundle=config.ca_bundle)
    channel = relay.channel()
    try:
        result = predict_through(
            channel=channel,
            streams=assignment.relay_keys.streams(
                job_config.job, credentials.hospital, str(asked["topic"])
            ),
            ids=TurnIds(
                job_config.job,
                int(asked["round"]),
                int(asked["position"]),
                job_config.mode,
                job_config.codec,
            ),
            mode=job_config.split_mode,
            split=split,
            parties=parties,
            images=images,
            limits=limits,
            privacy=job_config.privacy,
            noise_multiplier=noise,
            seed=job_config.seed,
            reply_timeout=config.reply_timeout,
            device=config.device,
        )
    finally:
        channel.close()
    out = request.out or config.work_dir / "predictions" / f"job-{request.job}.csv"
    masks = _write(out, request.paths, result.logits, segmentation=segmentation)
    return Predictions(csv=out, masks=masks, request=int(asked["request"]), samples=len(images))


def read_identifiers(path: Path) -> tuple[str, ...]:
    """The identifiers in ``path`` (see the module docstring), in order, each once.

    Raises:
        ConfigError: the file cannot be read or names none.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"the identifiers file {path} cannot be read: {e}") from e
    ids = [row[0].strip() for row in csv.reader(io.StringIO(text)) if row and row[0].strip()]
    if not ids:
        raise ConfigError(f"the identifiers file {path} names no record")
    return tuple(dict.fromkeys(ids))


def _predict_vertical(
    config: AgentConfig,
    request: PredictRequest,
    credentials: Credentials,
    coordinator: Coordinator,
    assignment: Assignment,
) -> Predictions:
    """The label party's vertical prediction (see the module docstring)."""
    assert request.ids is not None
    order = participants_in_order(assignment.raw["participants"])
    if order[0] != credentials.hospital:
        raise PredictProblem(
            f"only job {request.job}'s label party, {order[0]}, can ask for its "
            "predictions: what is predicted is its label"
        )
    wanted = read_identifiers(request.ids)
    taker = TurnTaker(
        config=config,
        credentials=credentials,
        identity=load_or_create_identity(config.work_dir),
        coordinator=coordinator,
        stopping=threading.Event(),
    )
    if taker.keep_final(assignment) is None:
        raise PredictProblem(
            f"no final weights of job {request.job} here yet: this agent keeps them once "
            "the job completes (run it until then)"
        )
    own = prediction_records(taker, assignment)
    row_of = {identifier: i for i, identifier in enumerate(own.identifiers)}
    missing = [i for i in wanted if i not in row_of]
    if missing:
        raise PredictProblem(
            f"{len(missing)} of the {len(wanted)} requested identifiers are not among this "
            f"party's vertical records (the first: {missing[0]!r}); nothing was asked"
        )
    records = own.rows([row_of[i] for i in wanted])
    asked = coordinator.request_vertical_prediction(job=request.job, records=len(records))
    part = {"id": int(asked["prediction"]), "round": int(asked["round"])}
    try:
        done = vertical_pass(
            taker,
            assignment,
            round_=part["round"],
            records=records,
            stage=prediction_stage(part["round"]),
            predict=True,
        )
    except VERTICAL_PASS_FAILURES as e:
        raise PredictProblem(_failed(coordinator, request.job, part["id"], str(e))) from e
    except BaseException as e:  # anything else still ends the others' wait, then is raised
        _failed(coordinator, request.job, part["id"], f"{type(e).__name__}: {e}", wait=False)
        raise
    assert done.aligned is not None and done.outcome.logits is not None
    logits = dict(zip(done.aligned.alignment.identifiers, done.outcome.logits, strict=True))
    out = request.out or config.work_dir / "predictions" / f"job-{request.job}.csv"
    _write_records(out, wanted, logits)
    return Predictions(csv=out, masks=None, request=part["id"], samples=len(logits))


def _failed(coordinator: Coordinator, job: int, part: int, error: str, *, wait: bool = True) -> str:
    """Why the prediction failed: this side's error, and the coordinator's reason once
    the worker has recorded it (it names the party or the check); this side's error is
    reported first, so the worker stops the others."""
    # It may have ended already (the worker's reason below), or the coordinator be away.
    with contextlib.suppress(CoordinatorError):
        coordinator.report_evaluation_problem(job=job, evaluation=part, reason=error[:2000])
    reason = ""
    for _ in range(20 if wait else 0):
        try:
            seen = coordinator.assignment(job).get("prediction") or {}
        except CoordinatorError:
            break
        if seen.get("id") == part and seen.get("status") != "running":
            reason = str(seen.get("failure_reason") or "")
            break
        time.sleep(0.5)
    return f"the prediction failed: {error}" + (f" (the coordinator: {reason})" if reason else "")


def _write_records(out: Path, wanted: tuple[str, ...], logits: dict[str, torch.Tensor]) -> None:
    """The vertical CSV, written whole or not at all."""
    classes = len(next(iter(logits.values())))
    text = io.StringIO()
    rows = csv.writer(text)
    rows.writerow(["identifier", "status", "predicted", *(f"p_{c}" for c in range(classes))])
    for identifier in wanted:
        if identifier not in logits:
            rows.writerow([identifier, NOT_HELD, "", *([""] * classes)])
            continue
        p = torch.softmax(logits[identifier].to(torch.float64), dim=0)
        rows.writerow([identifier, PREDICTED, int(p.argmax()), *(f"{v:.6f}" for v in p.tolist())])
    _parent(out)
    write_private(out, text.getvalue().encode())


def _write(
    out: Path, paths: tuple[str, ...], logits: torch.Tensor, *, segmentation: bool
) -> Path | None:
    """The CSV (and the masks' folder) written whole or not at all."""
    probabilities = torch.softmax(logits.to(torch.float64), dim=1)
    classes = probabilities.shape[1]
    text = io.StringIO()
    rows = csv.writer(text)
    if segmentation:
        masks = logits.argmax(dim=1).to(torch.uint8)
        rows.writerow(["path", "mask", *(f"fraction_{c}" for c in range(classes))])
        folder = out.with_name(out.stem + "_masks")
        names = [f"{i:05d}_{Path(p).stem}.png" for i, p in enumerate(paths)]
        for path, name, mask in zip(paths, names, masks, strict=True):
            share = [float((mask == c).double().mean()) for c in range(classes)]
            rows.writerow([path, name, *(f"{v:.6f}" for v in share)])
        staged = Path(tempfile.mkdtemp(prefix=".masks-", dir=_parent(out)))
        try:
            for name, mask in zip(names, masks, strict=True):
                Image.fromarray(np.ascontiguousarray(mask.numpy())).save(staged / name)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staged, folder)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        write_private(out, text.getvalue().encode())
        return folder
    predicted = probabilities.argmax(dim=1)
    rows.writerow(["path", "predicted", *(f"p_{c}" for c in range(classes))])
    for path, label, row in zip(paths, predicted.tolist(), probabilities.tolist(), strict=True):
        rows.writerow([path, label, *(f"{v:.6f}" for v in row)])
    write_private(out, text.getvalue().encode())
    return None


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path.parent


def check_request(job: int | None, paths: list[str], ids: str | None = None) -> None:
    """The command line's own checks, before anything is read."""
    if job is None:
        raise ConfigError("predict needs --job N (a completed job this hospital took part in)")
    if ids is not None and paths:
        raise ConfigError("predict takes image PATHs or --ids FILE (a vertical job), not both")
    if not paths and ids is None:
        raise ConfigError("predict needs at least one image PATH (or --ids FILE, vertical)")
