"""Naming a model runs its code: an agent imports no model module it does not list.

The attacker is the coordinator's side: a consortium admin whose coordinator lists a
module (MEDSPLIT_MODEL_MODULES) that a hospital never agreed to, or a dishonest
coordinator that changes a stored job to name one. Either way the hospital's agent, its
own code in this process against the real coordinator on a live server, refuses the
turn before it imports the module, and the coordinator records why. The module leaves a
marker file when imported; this process has it forgotten (and the marker removed) once
the coordinator's own validation imported it, as the agent's process would never have
had it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hospital_agent.turns import MODEL_MODULES_SETTING
from kernel.actors import Actor
from tests.model_modules import ARGS, listed, marked_module
from tests.security.test_handoff_keys import two_agents
from training import services
from training.apps import MODEL_MODULES_SETTING as COORDINATOR_SETTING
from training.models import Job, Turn
from training.scheduling import job_advance
from training.states import JobState

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("attack", ["listed by the coordinator", "a tampered job"])
def test_an_agent_refuses_a_model_module_it_does_not_list_before_importing_it(
    live_server, admin_actor: Actor, tmp_path: Path, monkeypatch, attack: str
) -> None:
    first, second = two_agents(live_server.url, tmp_path, admin_actor)
    marked = marked_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = {
        "model": "small_cnn",
        "num_classes": 2,
        "cuts": ["pool1"],
        "participants": [{"hospital": a.slug} for a in (first, second)],
    }
    if attack == "listed by the coordinator":
        with listed([marked.module], setting=COORDINATOR_SETTING):
            job = services.job_create(
                actor=admin_actor, data={**data, "model": marked.factory, "model_args": ARGS}
            )
        assert marked.imported(), "the coordinator, which lists it, built it to check the cuts"
        del sys.modules[marked.module]
        marked.marker.unlink()
    else:
        job = services.job_create(actor=admin_actor, data=data)
        described = {**job.description, "model": marked.factory, "model_args": ARGS}
        Job.objects.filter(pk=job.pk).update(description=described, model_name=marked.factory)
    job = services.job_transition(job=job, to=JobState.SCHEDULED, actor=admin_actor)
    turn = job_advance(job_id=job.pk)
    assert turn is not None and turn.hospital.slug == first.slug

    # The agent lists other modules only (its own model_modules).
    with listed(["monai"], setting=MODEL_MODULES_SETTING):
        assignment = first.assignment(job)
        assert assignment.description().model == marked.factory  # what it was sent
        assert first.taker.take(assignment) is None
    assert not marked.imported(), "the agent imported a module it does not list"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert f"{first.slug} reported a failed precondition" in turn.failure_reason
    assert f"model module {marked.module!r} is not allowed here" in turn.failure_reason
    assert "model_modules (MEDSPLIT_AGENT_MODEL_MODULES)" in turn.failure_reason
