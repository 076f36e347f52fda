"""Where a finished job's weights live: no party holds the whole model, so this lists each
part (the server's segment on the workers' storage, each hospital's front in its own agent's
work directory and sealed on the relay), by its size and SHA-256, never its bytes."""

from __future__ import annotations

from dataclasses import dataclass

from training.models import HandOff, Job
from training.runs import checkpoint_dir


@dataclass(frozen=True)
class WeightPart:
    """One part of a job's weights and where it lives."""

    party: str
    what: str
    where: str
    size_bytes: int | None
    sha256: str


def job_weights(*, job: Job) -> list[WeightPart]:
    """The parts of ``job``'s latest weights (its final ones once it completed)."""
    parts: list[WeightPart] = []
    row = job.server_checkpoint
    if row is not None:
        parts.append(
            WeightPart(
                party="workers",
                what=(
                    "server segment: the combination of the last round's (the job mode's result)"
                    if row.round_index >= job.rounds
                    else f"server segment after round {row.round_index}, position "
                    f"{row.position}, step {row.step}"
                ),
                where=str(checkpoint_dir() / row.path),
                size_bytes=row.size_bytes,
                sha256=row.sha256,
            )
        )
    latest = (
        HandOff.objects.filter(job=job)
        .select_related("sender", "recipient", "turn")
        .order_by("-id")
    )
    last_turn = latest.first().turn_id if latest.exists() else None
    for handoff in latest.filter(turn_id=last_turn).order_by("recipient__slug"):
        parts.append(
            WeightPart(
                party=handoff.recipient.slug,
                what=f"front (and head) sealed by {handoff.sender.slug} for it",
                where=f"the relay, and its agent's work_dir/jobs/job-{job.pk}/final.safetensors",
                size_bytes=handoff.size_bytes,
                sha256=handoff.ciphertext_sha256,
            )
        )
    if last_turn is not None:
        sender = latest.first().sender.slug
        parts.append(
            WeightPart(
                party=sender,
                what="front (and head), its own, in clear",
                where=f"its agent's work_dir/jobs/job-{job.pk}/state.safetensors",
                size_bytes=None,
                sha256="(not recorded: it never leaves the hospital)",
            )
        )
    return parts
