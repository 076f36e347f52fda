"""MedSplit's workers: the Celery app, the scheduler's tasks and the turn runner.

Start a worker with ``celery -A workers.celery_app worker`` and the scheduler's clock
with ``celery -A workers.celery_app beat`` (see docs/deploy.md).
"""
