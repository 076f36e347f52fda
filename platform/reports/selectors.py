"""What a job's result document says, gathered for one reader.

The document is a read: every figure comes from what the coordinator already holds (the
job's description, its turns and metric points, its hand-offs, the evaluation results,
the privacy figures and the audit chain), through the selectors that apply the
least-privilege rule (:mod:`kernel.permissions`): a hospital admin's document holds of
another hospital its name, place, turn states and sample counts, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, Sum
from django.utils import timezone

from audit.models import AuditEvent
from audit.selectors import VerifyResult, audit_verify_chain
from kernel.actors import Actor
from kernel.permissions import sees_participant_in_full
from medsplit.training.tasks import DEFAULT_TASK, TASKS
from reports.privacy import PrivacySection, privacy_section
from training.models import HandOff, HospitalEvaluation, Job, Turn
from training.selectors import job_get, job_loss_series, job_results, job_turns
from training.states import TERMINAL

#: The metric a task's turns report besides val_loss, and how the document names it.
METRIC_NAMES = {"accuracy": "accuracy", "dice": "mean Dice"}


@dataclass(frozen=True)
class Participant:
    """One hospital of the job, as the reader may see it."""

    position: int
    slug: str
    name: str
    turns_completed: int
    samples: int  # trained on over its turns (shown to every participant)
    in_full: bool
    feature_set: str = ""


@dataclass(frozen=True)
class RoundMetrics:
    """One hospital's validation at the end of its turn of one round."""

    round: int
    metric: float | None
    loss: float | None


@dataclass(frozen=True)
class Traffic:
    """Bytes one hospital's part of the job moved, as recorded by its turns and hand-offs."""

    slug: str
    name: str
    bytes_up: int  # at the cut, hospital to worker
    bytes_down: int  # at the cut, worker to hospital
    handoff_bytes: int  # its sealed weights, to every other participant
    handoffs: int
    evaluation_up: int  # at the cut, its evaluations of the final model
    evaluation_down: int


@dataclass(frozen=True)
class AuditSeal:
    """Where the audit chain stood at the end of the job, and whether it verifies.

    Attributes:
        seq, hash, at, action: the job's last audit row (its hash chains every row before
            it); ``seq`` 0 when the log holds none of the job.
        job_ended: whether the job is in a final state (else: its last row so far).
        verified: the chain verifies from its first row to its head, and the job's last
            row lies inside what was checked.
        result: the verifier's outcome (:func:`audit.selectors.audit_verify_chain`).
    """

    seq: int
    hash: str
    at: datetime | None
    action: str
    job_ended: bool
    verified: bool
    result: VerifyResult


@dataclass(frozen=True)
class JobDocument:
    """Every section of a job's result document, for one reader."""

    job: Job
    reader: str  # whose view it is, in words
    sees_all: bool
    generated_at: datetime
    metric: str  # accuracy or dice
    metric_name: str
    configuration: list[tuple[str, str]]
    participants: list[Participant]
    loss_series: dict[str, Any]
    validation: dict[str, list[RoundMetrics]]  # slug -> by round, hospitals seen in full
    baselines: dict[str, float]  # slug -> majority-class share, hospitals seen in full
    results: dict[str, Any]  # training.selectors.job_results: already filtered for the reader
    traffic: list[Traffic]
    privacy: PrivacySection
    audit: AuditSeal
    names: dict[str, str] = field(default_factory=dict)

    @property
    def traffic_totals(self) -> dict[str, int]:
        return {
            "bytes_up": sum(t.bytes_up for t in self.traffic),
            "bytes_down": sum(t.bytes_down for t in self.traffic),
            "handoff_bytes": sum(t.handoff_bytes for t in self.traffic),
            "evaluation_up": sum(t.evaluation_up for t in self.traffic),
            "evaluation_down": sum(t.evaluation_down for t in self.traffic),
        }


def job_document(*, actor: Actor, job_id: int) -> JobDocument:
    """The result document of job ``job_id`` as ``actor`` may read it.

    Raises:
        PermissionDenied: a person without a role, or an agent.
        NotFound: no such job, or one the actor may not see.
    """
    job = job_get(actor=actor, job_id=job_id)
    participants = list(job.participants.all())  # prefetched with their hospitals, in order
    names = {p.hospital.slug: p.hospital.name for p in participants}
    full = {p.hospital.slug: sees_participant_in_full(actor, p.hospital_id) for p in participants}
    metric = _task_metric(job)
    return JobDocument(
        job=job,
        reader=_reader(actor),
        sees_all=all(full.values()),
        generated_at=timezone.now(),
        metric=metric,
        metric_name=METRIC_NAMES.get(metric, metric),
        configuration=job_configuration(job),
        participants=_participants(job, participants, full),
        loss_series=job_loss_series(actor=actor, job=job),
        validation=_validation(job, full),
        baselines={
            p.hospital.slug: share
            for p in participants
            if full[p.hospital.slug] and (share := majority_share(p.hospital)) is not None
        },
        results=job_results(actor=actor, job_id=job.pk),
        traffic=_traffic(job, participants, full),
        privacy=privacy_section(job, actor),
        audit=audit_seal(job),
        names=names,
    )


def _reader(actor: Actor) -> str:
    who = actor.label.removeprefix("person:")
    role = actor.role.value.replace("_", " ") if actor.role else actor.kind.value
    if actor.hospital is not None:
        return f"{who} ({role} of {actor.hospital.slug})"
    return f"{who} ({role})"


def _task_metric(job: Job) -> str:
    described = job.description if isinstance(job.description, dict) else {}
    task = TASKS.get(str(described.get("task") or DEFAULT_TASK), TASKS[DEFAULT_TASK])
    return task.metric


def majority_share(hospital: Any) -> float | None:
    """The majority class's share of a hospital's reported labels (its heartbeat's label
    counts): the accuracy of always answering that class. None where not reported."""
    counts = (hospital.dataset_summary or {}).get("label_counts")
    if not isinstance(counts, dict):
        return None
    values = [n for n in counts.values() if isinstance(n, int) and not isinstance(n, bool)]
    total = sum(values)
    return max(values) / total if total > 0 else None


def job_configuration(job: Job) -> list[tuple[str, str]]:
    """The job's description in words, one (label, value) row per setting."""
    d = job.description if isinstance(job.description, dict) else {}

    def optimizer(config: Any) -> str:
        if not isinstance(config, dict) or not config:
            return "default"
        rest = {k: v for k, v in config.items() if k != "name"}
        settings = ", ".join(f"{k} {_value(v)}" for k, v in sorted(rest.items()))
        return f"{config.get('name', 'sgd')} ({settings})" if settings else config.get("name", "")

    augmentation = d.get("augmentation") or []
    augmented = ", then ".join(
        str(t.get("name"))
        + (
            " ({})".format(
                ", ".join(f"{k} {_value(v)}" for k, v in sorted(t.items()) if k != "name")
            )
            if len(t) > 1
            else ""
        )
        for t in augmentation
        if isinstance(t, dict)
    )
    rows = [
        ("Name", job.name or f"job {job.pk}"),
        ("Model", job.model_name),
    ]
    if d.get("model_args"):
        rows.append(("Model arguments", _value(d["model_args"])))
    rows += [
        ("Mode", job.mode),
        (
            "Task",
            f"{d.get('task') or 'classification'}"
            + (f", loss {d['loss']}" if d.get("loss") else ""),
        ),
        ("Cut(s)", ", ".join(d.get("cuts") or [])),
        ("Input shape", _value(d.get("input_shape") or [])),
        ("Classes", _value(d.get("num_classes"))),
        ("Rounds", str(job.rounds)),
        ("Batch size", _value(d.get("batch_size"))),
        ("Local epochs", _value(d.get("local_epochs"))),
        ("Max steps per turn", _value(d.get("max_steps_per_turn") or "no limit")),
        ("Client optimizer", optimizer(d.get("client_optimizer"))),
        ("Server optimizer", optimizer(d.get("server_optimizer"))),
        ("Augmentation", augmented or "none"),
        ("Codec", _value(d.get("codec"))),
        ("Seed", _value(d.get("seed"))),
    ]
    if d.get("mode_options"):
        options = d["mode_options"]
        rows.append(
            ("Mode options", ", ".join(f"{k} {_value(v)}" for k, v in sorted(options.items())))
        )
    for slug, spec in sorted((d.get("party_models") or {}).items()):
        if isinstance(spec, dict):
            rows.append((f"{slug}'s model", f"{spec.get('model')}, cut after {spec.get('cut')}"))
    on_failure = (
        f"retry (up to {job.max_retries} times)" if job.on_failure == "retry" else job.on_failure
    )
    rows += [
        ("On failure", on_failure),
        ("State", job.state),
        (
            "Created",
            _when(job.created_at)
            + (f" by {job.created_by.get_username()}" if job.created_by_id else ""),
        ),
        ("Started", _when(job.started_at)),
        ("Finished", _when(job.finished_at)),
        ("Description format", f"version {d.get('version', '?')}"),
    ]
    return rows


def _value(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(x)}" for k, x in sorted(v.items()))
    if v is None:
        return "–"
    return str(v)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "not yet"


def _participants(job: Job, participants: list, full: dict[str, bool]) -> list[Participant]:
    counted = {
        row["hospital_id"]: row
        for row in Turn.objects.filter(job=job)
        .values("hospital_id")
        .annotate(
            completed=Count("id", filter=Q(status=Turn.Status.COMPLETED)),
            samples=Sum("samples", filter=Q(status=Turn.Status.COMPLETED)),
        )
    }
    rows = []
    for p in participants:
        seen = full[p.hospital.slug]
        row = counted.get(p.hospital_id, {})
        rows.append(
            Participant(
                position=p.position,
                slug=p.hospital.slug,
                name=p.hospital.name,
                turns_completed=row.get("completed") or 0,
                samples=row.get("samples") or 0,
                in_full=seen,
                feature_set=p.feature_set if seen else "",
            )
        )
    return rows


def _validation(job: Job, full: dict[str, bool]) -> dict[str, list[RoundMetrics]]:
    """Each hospital's validation metrics by round (its last completed attempt), of the
    hospitals the reader sees in full: the others' metrics are theirs."""
    key = f"val_{_task_metric(job)}"
    chosen: dict[tuple[str, int], Turn] = {}
    for turn in job_turns(job=job).filter(status=Turn.Status.COMPLETED):
        if full.get(turn.hospital.slug):
            chosen[(turn.hospital.slug, turn.round.index)] = turn
    by_hospital: dict[str, list[RoundMetrics]] = {}
    for (slug, round_index), turn in sorted(chosen.items(), key=lambda kv: kv[0][1]):
        metrics = turn.metrics or {}
        by_hospital.setdefault(slug, []).append(
            RoundMetrics(round_index, _number(metrics.get(key)), _number(metrics.get("val_loss")))
        )
    return by_hospital


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _traffic(job: Job, participants: list, full: dict[str, bool]) -> list[Traffic]:
    """Bytes at the cut (every attempt of its turns: what crossed, crossed), its sealed
    hand-offs and its evaluations (every attempt), per hospital the reader sees in full."""
    turns = {
        row["hospital_id"]: row
        for row in Turn.objects.filter(job=job)
        .values("hospital_id")
        .annotate(up=Sum("bytes_up"), down=Sum("bytes_down"))
    }
    sealed = {
        row["sender_id"]: row
        for row in HandOff.objects.filter(job=job)
        .values("sender_id")
        .annotate(size=Sum("size_bytes"), count=Count("id"))
    }
    evaluated = {
        row["hospital_id"]: row
        for row in HospitalEvaluation.objects.filter(job=job)
        .values("hospital_id")
        .annotate(up=Sum("bytes_up"), down=Sum("bytes_down"))
    }
    rows = []
    for p in participants:
        if not full[p.hospital.slug]:
            continue
        t, h = turns.get(p.hospital_id, {}), sealed.get(p.hospital_id, {})
        e = evaluated.get(p.hospital_id, {})
        rows.append(
            Traffic(
                slug=p.hospital.slug,
                name=p.hospital.name,
                bytes_up=t.get("up") or 0,
                bytes_down=t.get("down") or 0,
                handoff_bytes=h.get("size") or 0,
                handoffs=h.get("count") or 0,
                evaluation_up=e.get("up") or 0,
                evaluation_down=e.get("down") or 0,
            )
        )
    return rows


def audit_seal(job: Job) -> AuditSeal:
    """The job's last audit row and the verification of the whole chain up to the head.

    The chain is checked as the system, whoever reads the document: the outcome holds
    ids and hashes only, which the hospitals' agents are shown anyway (audit.witness).
    """
    last = AuditEvent.objects.filter(job_id=job.pk).order_by("-id").first()
    result = audit_verify_chain(actor=None)
    seq = last.id if last else 0
    return AuditSeal(
        seq=seq,
        hash=last.hash if last else "",
        at=last.created_at if last else None,
        action=last.action if last else "",
        job_ended=job.state in TERMINAL,
        verified=result.ok and seq <= result.checked,
        result=result,
    )
