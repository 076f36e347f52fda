"""The server side of a round whose turns share one server segment (SplitFed's SFLV2),
run by one worker task: every turn of the group at once, one thread each, on one segment.

Each thread is a :class:`~medsplit.turns.TurnServer` with its own streams, lease, progress
and record (the same :class:`~workers.turn_runner.RunnerHooks` a lone turn has); the
:class:`~medsplit.turns.shared.SharedSegmentGate` applies their steps one at a time in the
mode's order drawn from the job's seed, so the segment's weights do not depend on timing.
Once every training step ran, the segment is recorded as the job's server state (where the
next round, or the job's result, starts); the turns complete after that. A turn that
fails, pauses or stops ends the round's task: every turn still running fails with its
reason and the job's failure policy applies to each (``retry`` runs the round again from
its start, the segment's state before its first step).
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, connection

from hospitals.relay_acl import relay_keys
from medsplit.channel.redis import RedisChannel
from medsplit.cutting import SplitModel
from medsplit.errors import MedSplitError
from medsplit.models import require_model_module
from medsplit.modes import GroupServer, require_mode
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ServerRole
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import cached_split, server_party
from medsplit.training.vertical_parts import job_vertical_model
from medsplit.turns import TurnFailed, TurnIds, TurnProgress, TurnServer
from medsplit.turns.joint import JointPartyRole, JointStep
from medsplit.turns.server import SERVER_PARTY, StepGate
from medsplit.turns.shared import SharedSegmentGate, SharedStart
from medsplit.turns.stores import read_verified
from training.alignment import aligned_size
from training.models import Job, Turn
from training.runs import (
    checkpoint_dir,
    shared_end_record,
    shared_start,
    turn_claim,
    turn_complete,
    turn_release,
)
from training.services import turn_fail
from training.states import JobState
from workers.relay_watch import guard as relay_guard
from workers.relay_watch import limits_of_job
from workers.turn_runner import EXTRA_MODES_SETTING, RunnerHooks, job_model, reported_limits

logger = logging.getLogger(__name__)

#: Steps between checkpoints of a shared turn: none (its store keeps the round's start).
_NO_CHECKPOINTS = 10**9


class GroupHooks(RunnerHooks):
    """A shared turn's hooks: its turn completes only once the shared segment's end is
    recorded, and without moving the job's server state to a checkpoint of its own."""

    def __init__(self, *, recorded: threading.Event, finishing: threading.Lock, **kwargs) -> None:
        super().__init__(**kwargs)
        self.recorded = recorded
        self.finishing = finishing

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        if not self.recorded.wait(settings.MEDSPLIT["TURN_SILENCE_SECONDS"]):
            raise TurnFailed("the round's shared server segment was not recorded in time")
        # One turn of the group completes at a time: the turns of a joint round end
        # together, and two completions of one job at once deadlocked in PostgreSQL.
        with self.finishing:
            self._record(progress, final=True)
            turn_complete(
                turn=self.turn,
                metrics=dict(metrics),
                crossed=progress.crossed,
                own_checkpoint=False,
            )


class PartialJointRound(TurnFailed):
    """A joint round (vertical) whose parties' turns are not all running: it cannot run."""


def shares_segment(job: Job) -> bool:
    """Whether ``job``'s turns of a group share one server segment (one task each round):
    SFLV2's steps in turn, or vertical's joined."""
    shared = (GroupServer.SHARED, GroupServer.JOINT)
    return job.training_config().split_mode.group_server() in shared


def group_of_shared_segment(turn_id: int) -> bool:
    """Whether turn ``turn_id`` is served with its group on one shared segment."""
    turn = Turn.objects.select_related("job").filter(pk=turn_id).first()
    try:
        return turn is not None and shares_segment(turn.job)
    except MedSplitError:
        return False  # an unknown mode: the lone turn's runner fails it, saying why


def job_of(turn_id: int) -> int | None:
    return Turn.objects.filter(pk=turn_id).values_list("job_id", flat=True).first()


def run(turn_id: int, *, runner: str) -> str:
    """Serve the whole group of turn ``turn_id`` (see the module docstring)."""
    first = Turn.objects.select_related("job", "round").filter(pk=turn_id).first()
    if first is None:
        return "no such turn"
    job = first.job
    turns = list(
        Turn.objects.filter(round=first.round, group=first.group, status=Turn.Status.RUNNING)
        .select_related("hospital", "round")
        .order_by("position")
    )
    lease = settings.MEDSPLIT["TURN_LEASE_SECONDS"]
    claims = []
    for turn in turns:
        claim = turn_claim(turn_id=turn.pk, runner=runner, lease_seconds=lease)
        if claim is None:  # another runner holds the group (or it ended): leave it
            for held in claims:
                turn_release(turn_id=held.turn.pk, runner=runner)
            return "not claimed"
        claims.append(claim)
    try:
        return _serve(job, first.round.index, claims, runner, lease)
    except PartialJointRound as e:
        # Sent again it would fail again: the job's failure policy decides, with the reason.
        logger.warning("job %s: %s", job.pk, e)
        for claim in claims:
            turn_fail(turn=Turn.objects.get(pk=claim.turn.pk), reason=str(e))
        return "failed"
    finally:
        for claim in claims:
            turn_release(turn_id=claim.turn.pk, runner=runner)


@dataclass
class _GroupPlan:
    """What the group's turns share: the server segment (and its split), where it starts,
    the gate ordering or joining their steps, each turn's limits and role factory."""

    party: Party
    split: SplitModel | None
    start: bytes
    gate: StepGate
    limits: list[FrameLimits]
    roles: list[Callable[[], ServerRole] | None]


def _round_start(job: Job, round_index: int, party: Party) -> bytes:
    """The shared segment's state at the round's start, loaded into ``party``."""
    row = shared_start(job=job, round_index=round_index)
    start = (
        read_verified(checkpoint_dir() / row.path, row.sha256)
        if row is not None
        else export_parties({SERVER_PARTY: party})
    )
    import_parties(start, {SERVER_PARTY: party})
    return start


def _shared_plan(job: Job, config: TrainingConfig, round_index: int, claims: list) -> _GroupPlan:
    """SFLV2: one segment, the group's steps one at a time in the mode's seeded order."""
    split = cached_split(job_model(job), config.cuts)
    party = server_party(split, config)
    start = _round_start(job, round_index, party)
    limits = [reported_limits(job, config, c.turn.hospital) for c in claims]
    lengths = [lim.train_steps for lim in limits]
    positions = [c.turn.position for c in claims]
    order = [
        positions[i]
        for i in config.split_mode.step_order(lengths, seed=config.seed, round_index=round_index)
    ]
    return _GroupPlan(party, split, start, SharedSegmentGate(order), limits, [None] * len(claims))


def _joint_plan(job: Job, config: TrainingConfig, round_index: int, claims: list) -> _GroupPlan:
    """Vertical: one top segment, each step joining every party's frame of it."""
    participants = tuple(
        c.turn.hospital.slug for c in sorted(claims, key=lambda c: c.turn.position)
    )
    everyone = tuple(job.participants.order_by("position").values_list("hospital__slug", flat=True))
    if participants != everyone:
        missing = ", ".join(p for p in everyone if p not in participants)
        raise PartialJointRound(
            f"round {round_index + 1} of a vertical job needs every party's turn at once, and "
            f"{missing} no longer has a running one (its turn ended): the round cannot run "
            "for some parties only"
        )
    fronts = job.job_description().party_fronts()
    for front in fronts:
        require_model_module(front.model.name)  # before anything of it is imported
    model = job_vertical_model(job_model(job), config, participants, fronts)
    party = Party.create(copy.deepcopy(model.top), config.server_optimizer)
    start = _round_start(job, round_index, party)
    size = aligned_size(job)
    if size is None:
        raise TurnFailed(
            "the parties' record alignment is not agreed yet, so the steps of the round "
            "cannot be checked against it"
        )
    limits = turn_limits(config, num_classes=job.job_description().num_classes, train=size, val=0)
    server = config.split_mode.joint_server_role(  # type: ignore[attr-defined]
        party,
        inputs=model.inputs,
        top_input=model.top_input,
        head_boundary=model.head_boundary,
        label_party=model.label_party,
        job=config.job,
        codec=config.codec,
        limits=limits,
    )
    joint = JointStep(server, steps=limits.train_steps or 0)
    roles: list[Callable[[], ServerRole] | None] = [
        functools.partial(
            JointPartyRole, joint, party=c.turn.hospital.slug, job=config.job, mode=config.mode
        )
        for c in claims
    ]
    return _GroupPlan(party, None, start, joint, [limits] * len(claims), roles)


def _serve(job: Job, round_index: int, claims: list, runner: str, lease: float) -> str:
    options = settings.MEDSPLIT
    require_mode(job.mode, setting=EXTRA_MODES_SETTING)
    config = job.training_config()
    joint = config.split_mode.group_server() == GroupServer.JOINT
    plan = (_joint_plan if joint else _shared_plan)(job, config, round_index, claims)
    party, split, start, gate = plan.party, plan.split, plan.start, plan.gate
    recorded = threading.Event()
    finishing = threading.Lock()
    outcomes: dict[int, str] = {}
    bounds = limits_of_job(job)

    def serve(claim, lim, role) -> None:
        turn = claim.turn
        channel = RedisChannel(
            options["WORKER_REDIS_URL"],
            max_message_bytes=bounds.frame_bytes,
            max_backlog_bytes=bounds.stream_bytes,
        )
        hooks = GroupHooks(
            recorded=recorded,
            finishing=finishing,
            turn=turn,
            runner=runner,
            lease_seconds=lease,
            guard=relay_guard(),
        )
        try:
            server = TurnServer(
                ids=TurnIds(config.job, round_index, turn.position, config.mode, config.codec),
                channel=channel,
                streams=relay_keys().streams(config.job, turn.hospital.slug),
                split=split,
                party=party,
                store=SharedStart(start),
                hooks=hooks,
                limits=lim,
                hospital=turn.hospital.slug,
                checkpoint_every=_NO_CHECKPOINTS,
                silence_timeout=options["TURN_SILENCE_SECONDS"],
                initial=TurnProgress(),
                reset_streams=claim.taken_over or turn.attempt > 1 or turn.runs > 1,
                gate=gate,
                mode=config.split_mode,
                role=role,
                loss_fn=config.loss_fn(),  # the job's task's (a mask's Dice and CE)
            )
            outcomes[turn.pk] = server.run().value
        except Exception as e:  # the group's end decides, below
            outcomes[turn.pk] = f"{type(e).__name__}: {e}"
            logger.warning("turn %s (shared round): %s", turn.pk, outcomes[turn.pk])
        finally:
            channel.close()
            if hooks.guard is not None:
                hooks.guard.client.close()
            connection.close()  # this thread's database connection
        if outcomes[turn.pk] != "completed":
            gate.fail(f"the turn of {turn.hospital.slug} ended: {outcomes[turn.pk]}")

    threads = [
        threading.Thread(target=serve, args=(c, lim, role), name=f"turn-{c.turn.pk}", daemon=True)
        for c, lim, role in zip(claims, plan.limits, plan.roles, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        while not gate.wait_trained(timeout=1.0):
            if not any(t.is_alive() for t in threads):
                break
        if gate.trained:
            shared_end_record(
                turn=claims[-1].turn,
                round_index=round_index,
                data=export_parties({SERVER_PARTY: party}),
            )
            recorded.set()
    except TurnFailed as e:
        logger.warning("job %s round %s: the shared round stopped: %s", job.pk, round_index, e)
    for thread in threads:
        thread.join()
    close_old_connections()
    failed = {pk: why for pk, why in outcomes.items() if why != "completed"}
    if not failed:
        logger.info(
            "job %s round %s: %d turns served on one server segment (%d steps)",
            job.pk,
            round_index,
            len(claims),
            len(gate.served),
        )
        return "completed"
    job.refresh_from_db()
    if job.state != JobState.RUNNING:
        # Paused or cancelled under the running turns: they stay as the job's state left
        # them (a paused round runs again from its start when the job resumes).
        return str(job.state)
    reason = "; ".join(f"turn {pk}: {why}" for pk, why in sorted(failed.items()))
    for claim in claims:
        turn = Turn.objects.get(pk=claim.turn.pk)
        if turn.status == Turn.Status.RUNNING:
            turn_fail(turn=turn, reason=f"the round's shared server segment stopped ({reason})")
    return "failed"
