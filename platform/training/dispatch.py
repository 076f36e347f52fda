"""The hook that tells the workers at once that a job has work to do.

The coordinator does not import Celery (the arrows point from ``workers/`` to the
platform, never back): ``settings.MEDSPLIT["JOB_DISPATCHER"]`` names a class built
without arguments whose ``job_changed(job_id)`` is called after a job is scheduled or
resumed, once the transaction has committed. ``workers.dispatch.CeleryDispatcher``
sends the scheduler's task; the default, :class:`SweepOnlyDispatcher`, does nothing and
leaves the job to the scheduler's periodic sweep, which finds it within
``MEDSPLIT["SWEEP_SECONDS"]``. A dispatcher that fails is logged, never raised: the
sweep is the safety net, so a broker that is down delays a job but fails no request.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)


@runtime_checkable
class JobDispatcher(Protocol):
    def job_changed(self, job_id: int) -> None:
        """Job ``job_id`` was scheduled or resumed: have the scheduler look at it."""
        ...


class SweepOnlyDispatcher:
    """Leaves every job to the periodic sweep."""

    def job_changed(self, job_id: int) -> None:
        logger.debug("job %s changed; the scheduler's sweep will pick it up", job_id)


def get_dispatcher() -> JobDispatcher:
    path = settings.MEDSPLIT.get("JOB_DISPATCHER") or "training.dispatch.SweepOnlyDispatcher"
    dispatcher = import_string(path)()
    if not isinstance(dispatcher, JobDispatcher):
        raise TypeError(f"MEDSPLIT['JOB_DISPATCHER'] = {path!r} has no job_changed(job_id)")
    return dispatcher


def job_changed_on_commit(job_id: int) -> None:
    """Call the dispatcher for ``job_id`` once the current transaction commits."""

    def notify() -> None:
        try:
            get_dispatcher().job_changed(job_id)
        except Exception:  # the sweep will find the job; a request must not fail here
            logger.exception("could not notify the workers about job %s", job_id)

    transaction.on_commit(notify)


def inference_requested_on_commit(request_id: int) -> None:
    """Tell the dispatcher, once the transaction commits, that inference request
    ``request_id`` waits (a dispatcher without ``inference_requested`` leaves it to the
    sweep, as a failing one does)."""

    def notify() -> None:
        try:
            dispatcher = get_dispatcher()
            send = getattr(dispatcher, "inference_requested", None)
            if send is not None:
                send(request_id)
        except Exception:  # the sweep will send it; a request must not fail here
            logger.exception("could not send inference request %s to the workers", request_id)

    transaction.on_commit(notify)
