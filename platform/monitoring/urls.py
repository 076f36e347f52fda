"""API routes of the monitoring app (under /api/); /metrics is the project's own route."""

from django.urls import path

from monitoring.views import QueuesView

urlpatterns = [path("queues/", QueuesView.as_view(), name="queues")]
