"""A job whose model is a ``MODULE:FACTORY`` a hospital brought, end to end with real
processes.

:func:`tiny_net` lives in this file and nowhere else. Every party lists this module and
no other: the coordinator (the live server in this process) in
``MEDSPLIT["MODEL_MODULES"]``, the Celery worker through ``MEDSPLIT_MODEL_MODULES``, the
two agents through ``MEDSPLIT_AGENT_MODEL_MODULES``. A real job with ``model_args``
trains one round, and every hospital's final weights and the server's equal unsplit
training of the same factory's model over the same batches (``torch.equal``).

The module imports only torch at its top: the agents and the worker import it for the
factory, and an agent never imports Django.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch import nn

MODULE = __name__
FACTORY = f"{MODULE}:tiny_net"


def tiny_net(channels: int = 4, num_classes: int = 2) -> nn.Module:
    """A small classifier of 1x28x28 images, cut after ``pool``."""
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(1, channels, 3, padding=1),
            act=nn.ReLU(),
            pool=nn.MaxPool2d(4),
            flat=nn.Flatten(),
            head=nn.Linear(channels * 7 * 7, num_classes),
        )
    )


@pytest.fixture
def processes(tmp_path: Path, redis_url: str, settings) -> Iterator[object]:
    """The harness's ``processes`` (tests/workers/processes.py), imported only here: that
    module imports the coordinator's models, which the processes importing this file for
    the factory must not."""
    from tests.workers import processes as harness

    yield from harness.processes.__wrapped__(tmp_path, redis_url, settings)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_factory_model_from_a_listed_module_trains_exactly_end_to_end(
    processes, live_server, settings, redis_url: str, tmp_path: Path, admin_actor
) -> None:
    from django.core.cache import cache

    from tests.model_modules import listed
    from tests.workers.agents import Agents, assert_exact, small_job, wait_completed
    from tests.workers.processes import wait_evaluated, workers_relay_user
    from training.apps import MODEL_MODULES_SETTING
    from training.models import Turn

    if not redis_url.startswith("redis://"):
        pytest.skip("per-hospital Redis users need a Redis reached over TCP")
    settings.MEDSPLIT = {
        **settings.MEDSPLIT,
        "REDIS_URL": redis_url,
        "REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
    }
    # What the training app's ready() does with MEDSPLIT["MODEL_MODULES"] = [MODULE].
    with listed([MODULE], setting=MODEL_MODULES_SETTING):
        try:
            cache.clear()  # the live server's throttles: every agent enrols from 127.0.0.1
            processes.env["MEDSPLIT_MODEL_MODULES"] = MODULE
            agents = Agents(processes, live_server.url, tmp_path).enrol(
                admin_actor, 2, extra={"MEDSPLIT_AGENT_MODEL_MODULES": MODULE}
            )
            with workers_relay_user(redis_url, processes):
                processes.celery_worker("worker")
                processes.celery_beat()
                job = small_job(
                    admin_actor,
                    agents.hospitals,
                    model=FACTORY,
                    model_args={"channels": 3, "num_classes": 2},
                    cuts=["pool"],
                )
                wait_completed(processes, job, agents, 300)
                wait_evaluated(processes, job)
                # Stopped while their Redis user exists: a worker without it retries until killed.
                processes.stop_all()
            assert job.job_description().model_args == {"channels": 3, "num_classes": 2}
            assert set(Turn.objects.filter(job=job).values_list("status", flat=True)) == {
                "completed"
            }
            assert_exact(job, agents)
        finally:
            # The agents poll the live server until stopped.
            processes.stop_all()  # together: the slowest shutdown, not their sum
