"""The job dispatcher the coordinator calls when a job is scheduled or resumed
(``MEDSPLIT_JOB_DISPATCHER=workers.dispatch.CeleryDispatcher``; see training/dispatch.py)."""

from __future__ import annotations


class CeleryDispatcher:
    """Sends the scheduler's ``advance_job`` task for the job."""

    def job_changed(self, job_id: int) -> None:
        from workers.tasks import advance_job  # the web process loads Celery only here

        advance_job.delay(job_id)

    def inference_requested(self, request_id: int) -> None:
        """Sends the inference task to the inference queue at once."""
        from workers.tasks import send_inference

        send_inference(request_id)

    def export_approved(self, export_id: int) -> None:
        """Sends the task that seals the export's server segment."""
        from workers.tasks import seal_export

        seal_export.delay(export_id)
