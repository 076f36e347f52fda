"""Export by consent, at a hospital: ``approve-export``, ``refuse-export``, ``fetch-export``.

* The receiving hospital's agent makes a **fresh export key** (a recipient key pair of its
  own, never a job's: those are deleted when the job ends), keeps the private half 0600
  in ``<work_dir>/exports/export-N/export.key`` and publishes the public half signed by its
  identity key for ``export-N`` before it approves.
* Every other participant's agent approves, waits until every hospital has (a refusal
  stops it), checks the export key's signature against the receiver's *pinned* identity,
  then seals its own segments (its job's ``final.safetensors``: the front, and the head in
  U-shaped mode) to it and leaves the ciphertext with the coordinator. A worker seals the
  server segment.
* ``fetch-export`` at the receiver opens every part, refuses a hospital whose segments are
  not this hospital's own final weights (by name), assembles the whole model, checks it
  equals the split model on its validation images (``torch.equal``), writes
  ``model.safetensors`` and ``metadata.json`` (all or nothing) and deletes the export key.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from hospital_agent.config import AgentConfig
from hospital_agent.coordinator import Backoff, Coordinator
from hospital_agent.data.transforms import load_for_job
from hospital_agent.export import (
    ExportAssemblyError,
    ExportMetadata,
    assemble_state,
    build_assembled,
    check_same_outputs,
    write_export,
)
from hospital_agent.identity import (
    Credentials,
    forget_private,
    load_credentials,
    load_identity,
    read_private,
    write_private,
)
from hospital_agent.pins import Pins
from hospital_agent.service import use_deterministic_kernels
from hospital_agent.turns import MODEL_MODULES_SETTING, Assignment, job_folder
from medsplit.errors import MedSplitError, SealError
from medsplit.models import is_factory_name, set_model_modules
from medsplit.protocol.handoff import import_parties
from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, identity_public_from_b64
from medsplit.protocol.sealing import SealContext, seal, unseal
from medsplit.training.setup import client_parties, hospital_segments, hospital_split

__all__ = ["ExportProblem", "approve_export", "fetch_export", "refuse_export"]

#: The part the worker seals (the coordinator's ``exports.models.SERVER_PART``).
SERVER_PART = "server"
EXPORT_KEY_FILE = "export.key"
#: How many validation images the assembled model is checked on, and in what batches.
CHECK_IMAGES = 32
CHECK_BATCH = 16
POLL_SECONDS = 1.0


class ExportProblem(MedSplitError):
    """The export cannot go on here; the message says why and what to do."""


@dataclass(frozen=True)
class Fetched:
    """What ``fetch-export`` wrote and checked."""

    out: Path
    parts: int
    size_bytes: int
    checked_images: int


def export_name(export_id: int) -> str:
    """What an export key is signed for and its blobs are sealed for (never a job's name)."""
    return f"export-{export_id}"


def export_key_path(work_dir: Path, export_id: int) -> Path:
    return work_dir / "exports" / export_name(export_id) / EXPORT_KEY_FILE


# -- the commands ----------------------------------------------------------------------


def approve_export(config: AgentConfig, export_id: int, *, wait: float = 600.0) -> str:
    """Approve export ``export_id``; a sender then seals its segments once it is approved.

    Returns what happened, for the command's one line.
    """
    session = _Session.open(config)
    info = session.coordinator.export(export_id)
    _not_refused(info)
    receiver = info["recipient"] == session.me
    if receiver:
        key = _export_key(config.work_dir, export_id)
        signed = SignedRecipientKey.sign(
            job=export_name(export_id),
            hospital=session.me,
            key=key.public(),
            identity=session.identity,
        )
        session.coordinator.publish_export_key(export_id, **signed.to_json())
    info = session.coordinator.approve_export(export_id)
    if receiver:
        return f"export {export_id} approved ({info['state']}); fetch it with fetch-export"
    info = _wait_for(session, export_id, wait, lambda i: i["state"] == "approved", "approved")
    blob = _seal_own(session, info)
    sent = session.coordinator.upload_export_part(export_id, blob)
    return (
        f"export {export_id} approved; this hospital's segments sealed for "
        f"{info['recipient']} ({sent['size_bytes']} bytes)"
    )


def refuse_export(config: AgentConfig, export_id: int, *, reason: str) -> str:
    """Refuse export ``export_id``: it stops for every hospital."""
    if not reason.strip():
        raise ExportProblem("refuse-export needs --reason TEXT (the others are told it)")
    session = _Session.open(config)
    info = session.coordinator.refuse_export(export_id, reason=reason)
    forget_private(export_key_path(config.work_dir, export_id))  # the receiver's, if made
    return f"export {export_id} refused ({info['state']})"


def fetch_export(config: AgentConfig, export_id: int, out: Path, *, wait: float = 600.0) -> Fetched:
    """Open, check and assemble export ``export_id``; write it under ``out``."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportProblem(f"{out} exists and is not an empty folder: choose another --out")
    session = _Session.open(config)
    info = session.coordinator.export(export_id)
    _not_refused(info)
    if info["recipient"] != session.me:
        raise ExportProblem(f"export {export_id} goes to {info['recipient']}, not to this hospital")
    path = export_key_path(config.work_dir, export_id)
    if not path.exists():
        raise ExportProblem(
            f"no export key in {path.parent}: approve-export makes it (it is deleted once "
            "the model is fetched)"
        )
    key = RecipientKey.from_bytes(read_private(path))
    info = _wait_for(
        session,
        export_id,
        wait,
        lambda i: (
            i["state"] == "approved" and set(i["expected_parts"]) <= {p["name"] for p in i["parts"]}
        ),
        "approved and every part sealed",
    )
    job = int(info["job"])
    model_setup = _JobSetup.load(session, job)
    own = model_setup.own_state()
    parts: dict[str, dict[str, torch.Tensor]] = {"own": own}
    size = 0
    for name in info["expected_parts"]:
        blob = session.coordinator.download_export_part(export_id, name)
        size += len(blob)
        if name == SERVER_PART:
            sender = identity_public_from_b64(info["server_identity"])
        else:
            sender = session.pins.identity(model_setup.assignment.participant(name))
        try:
            plain = unseal(
                blob,
                recipient=key,
                sender=sender,
                context=SealContext(
                    job=export_name(export_id),
                    round=0,
                    sender=name,
                    recipient=session.me,
                    purpose="export",
                ),
            )
            state = load_tensors(plain)
        except (SealError, SafetensorError) as e:
            raise ExportProblem(f"export {export_id}: the part from {name} is refused: {e}") from e
        if name == SERVER_PART:
            parts[SERVER_PART] = state
        else:
            _same_as_own(name, state, own, job)
    merged = assemble_state(parts)
    meta = model_setup.metadata(session.coordinator.audit_head())
    assembled = build_assembled(meta, merged)
    batches = model_setup.check_batches(config)
    check_same_outputs(assembled, model_setup.split_forward(parts[SERVER_PART]), batches)
    _write_whole(out, meta, merged)
    session.coordinator.export_fetched(
        export_id, parts=len(info["expected_parts"]), size_bytes=size
    )
    forget_private(path)
    shutil.rmtree(path.parent, ignore_errors=True)
    return Fetched(
        out=out,
        parts=len(info["expected_parts"]),
        size_bytes=size,
        checked_images=sum(len(b) for b in batches),
    )


# -- the pieces ------------------------------------------------------------------------


@dataclass
class _Session:
    credentials: Credentials
    identity: MLDSA65PrivateKey
    coordinator: Coordinator
    pins: Pins
    config: AgentConfig

    @property
    def me(self) -> str:
        return self.credentials.hospital

    @classmethod
    def open(cls, config: AgentConfig) -> _Session:
        credentials = load_credentials(config.work_dir)
        identity = load_identity(config.work_dir)
        if credentials is None or identity is None:
            raise ExportProblem(f"this agent is not enrolled (nothing in {config.work_dir})")
        coordinator = Coordinator(
            config.coordinator_url,
            token=credentials.token,
            ca_bundle=config.ca_bundle,
            backoff=Backoff(give_up_after=60.0),
        )
        return cls(credentials, identity, coordinator, Pins(config.work_dir), config)


@dataclass
class _JobSetup:
    """A completed job's model, cut, and this hospital's final weights."""

    assignment: Assignment
    final: Path

    @classmethod
    def load(cls, session: _Session, job: int) -> _JobSetup:
        set_model_modules(session.config.model_modules, setting=MODEL_MODULES_SETTING)
        assignment = Assignment(session.coordinator.assignment(job))
        final = job_folder(session.config.work_dir, job) / "final.safetensors"
        if not final.exists():
            raise ExportProblem(
                f"no final weights of job {job} in {final.parent}: this agent keeps them "
                "once the job completes"
            )
        return cls(assignment, final)

    def _split(self):
        config = self.assignment.config()
        return hospital_split(self.assignment.model(), config.cuts, hospital_segments(config))

    def _clients(self) -> dict[str, Any]:
        parties = client_parties(self._split(), self.assignment.config())
        import_parties(self.final.read_bytes(), parties)
        return parties

    def own_state(self) -> dict[str, torch.Tensor]:
        """This hospital's segments' weights and buffers, under the model's names."""
        state: dict[str, torch.Tensor] = {}
        for party in self._clients().values():
            state.update(party.module.state_dict())
        return {n: t.detach().clone().contiguous() for n, t in state.items()}

    def split_forward(self, server_state: dict[str, torch.Tensor]) -> Callable:
        """The split model as the job runs it: this hospital's segments and the server's."""
        config = self.assignment.config()
        split = self._split()
        # The hospital keeps the server's segment as structure only (meta tensors).
        server = copy.deepcopy(split.segments[config.split_mode.server_segment])
        server.load_state_dict(server_state, strict=True, assign=True)
        modules: dict[int, torch.nn.Module] = {config.split_mode.server_segment: server}
        for name, party in self._clients().items():
            modules[config.split_mode.client_segments()[name]] = party.module
        ordered = [modules[i].eval() for i in sorted(modules)]

        def forward(batch: torch.Tensor) -> torch.Tensor:
            out = ordered[0](batch)
            for module in ordered[1:]:
                out = module(**out)
            return out

        return forward

    def metadata(self, head: dict[str, Any]) -> ExportMetadata:
        model = self.assignment.model()
        if is_factory_name(model.name):
            raise ExportProblem(
                f"model {model.name!r} is a factory; only registry models are exported yet"
            )
        return ExportMetadata(
            model_name=model.name,
            model_args={
                "spatial_dims": model.spatial_dims,
                "in_channels": model.in_channels,
                "num_classes": model.num_classes,
                "seed": model.seed,
            },
            input_shape=list(model.input_shape),
            cut=list(self.assignment.config().cuts),
            job_id=self.assignment.job,
            audit_head=f"{head['seq']}:{head['hash']}",
            transforms=[
                "monai.transforms.LoadImage (channels first)",
                "monai.transforms.ScaleIntensity(minv=0.0, maxv=1.0)",
                f"monai.transforms.Resize({list(model.input_shape[1:])})",
                "monai.transforms.ScaleIntensity(minv=0.0, maxv=1.0)",
            ],
        )

    def check_batches(self, config: AgentConfig) -> list[torch.Tensor]:
        """The first validation images of this hospital, as training fitted them."""
        use_deterministic_kernels(config.deterministic)
        model, job_config = self.assignment.model(), self.assignment.config()
        data = load_for_job(
            config.data,
            input_shape=tuple(model.input_shape),
            num_classes=model.num_classes,
            task=job_config.task,
            val_fraction=config.val_fraction,
            seed=config.split_seed,
        )[0]
        images = data.val.images[:CHECK_IMAGES]
        if len(images) == 0:
            raise ExportProblem("this hospital has no validation images to check the model on")
        return list(images.split(CHECK_BATCH))


def _export_key(work_dir: Path, export_id: int) -> RecipientKey:
    path = export_key_path(work_dir, export_id)
    if path.exists():
        return RecipientKey.from_bytes(read_private(path))
    key = RecipientKey.generate()
    write_private(path, key.to_bytes())
    return key


def _not_refused(info: dict[str, Any]) -> None:
    if info["state"] == "refused":
        raise ExportProblem(
            f"export {info['id']} was refused by {info['refused_by']}: "
            f"{info['refusal_reason']!r}; nothing is sealed"
        )


def _wait_for(
    session: _Session, export_id: int, wait: float, ready: Callable[[dict], bool], what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + wait
    while True:
        info = session.coordinator.export(export_id)
        _not_refused(info)
        if ready(info):
            return info
        if time.monotonic() > deadline:
            raise ExportProblem(
                f"export {export_id} is not {what} after {wait:.0f} s ({info['state']}); "
                "run the command again later"
            )
        time.sleep(POLL_SECONDS)


def _seal_own(session: _Session, info: dict[str, Any]) -> bytes:
    """This hospital's segments, sealed to the export key once it verifies under the
    receiver's pinned identity."""
    job = int(info["job"])
    setup = _JobSetup.load(session, job)
    recipient = info["recipient"]
    if not info.get("recipient_key"):
        raise ExportProblem(f"{recipient} has published no export key yet")
    name = export_name(int(info["id"]))
    signed = SignedRecipientKey.from_json(job=name, hospital=recipient, data=info["recipient_key"])
    try:
        return seal(
            save_tensors(setup.own_state()),
            sender=session.identity,
            recipient=signed,
            recipient_identity=session.pins.identity(setup.assignment.participant(recipient)),
            context=SealContext(
                job=name, round=0, sender=session.me, recipient=recipient, purpose="export"
            ),
        )
    except SealError as e:
        raise ExportProblem(f"export {info['id']}: nothing sealed: {e}") from e


def _same_as_own(
    sender: str, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], job: int
) -> None:
    """Every participant ends a job with the same final weights: refuse any other."""
    differ = sorted(set(state) ^ set(own)) or sorted(
        n for n in own if not torch.equal(state[n], own[n])
    )
    if differ:
        raise ExportAssemblyError(
            f"{sender} sent segments that are not the final weights of job {job} this "
            f"hospital holds (differing: {differ[:5]}): the export is refused"
        )


def _write_whole(out: Path, meta: ExportMetadata, state: dict[str, torch.Tensor]) -> None:
    """Write the export into a staging folder beside ``out``, then move it in place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".export-", dir=out.parent))
    try:
        write_export(staged, meta, state)
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
