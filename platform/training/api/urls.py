"""API routes of the training app (included under /api/)."""

from django.urls import path

from training.api import key_views, views
from training.states import JobState

urlpatterns = [
    path("modes/", views.ModeListView.as_view(), name="mode-list"),
    path("codecs/", views.CodecListView.as_view(), name="codec-list"),
    path("tasks/", views.TaskListView.as_view(), name="task-list"),
    path("optimizers/", views.OptimizerListView.as_view(), name="optimizer-list"),
    path("augmentations/", views.AugmentationListView.as_view(), name="augmentation-list"),
    path("models/", views.ModelListView.as_view(), name="model-list"),
    path("model-modules/", views.ModelModulesView.as_view(), name="model-modules"),
    path("models/<str:name>/cuts/", views.ModelCutsView.as_view(), name="model-cuts"),
    path("jobs/", views.JobListCreateView.as_view(), name="job-list"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/status/", views.JobStatusView.as_view(), name="job-status"),
    path("jobs/<int:job_id>/turns/", views.JobTurnsView.as_view(), name="job-turns"),
    path("jobs/<int:job_id>/results/", views.JobResultsView.as_view(), name="job-results"),
    path("jobs/<int:job_id>/evaluate/", views.JobEvaluateView.as_view(), name="job-evaluate"),
    path("jobs/<int:job_id>/metrics/", views.JobMetricsView.as_view(), name="job-metrics"),
    path(
        "jobs/<int:job_id>/loss-series/", views.JobLossSeriesView.as_view(), name="job-loss-series"
    ),
    path("jobs/<int:job_id>/privacy/", views.JobPrivacyView.as_view(), name="job-privacy"),
    path(
        "jobs/<int:job_id>/schedule/",
        views.transition_view(JobState.SCHEDULED, "Schedule a draft job (consortium admins)"),
        name="job-schedule",
    ),
    path(
        "jobs/<int:job_id>/pause/",
        views.transition_view(JobState.PAUSED, "Pause a running job (consortium admins)"),
        name="job-pause",
    ),
    path(
        "jobs/<int:job_id>/resume/",
        views.transition_view(JobState.RUNNING, "Resume a paused job (consortium admins)"),
        name="job-resume",
    ),
    path(
        "jobs/<int:job_id>/cancel/",
        views.transition_view(JobState.CANCELLED, "Cancel a job (consortium admins)"),
        name="job-cancel",
    ),
    path("agent/assignments/", views.AgentAssignmentListView.as_view(), name="agent-assignments"),
    path(
        "agent/assignments/<int:job_id>/",
        views.AgentAssignmentDetailView.as_view(),
        name="agent-assignment",
    ),
    path(
        "agent/assignments/<int:job_id>/handoffs/",
        views.AgentHandoffView.as_view(),
        name="agent-handoffs",
    ),
    path(
        "agent/assignments/<int:job_id>/handoffs/batch/",
        views.AgentHandoffsView.as_view(),
        name="agent-handoffs-batch",
    ),
    path(
        "agent/assignments/<int:job_id>/recipient-key/",
        key_views.AgentRecipientKeyView.as_view(),
        name="agent-recipient-key",
    ),
    path(
        "agent/assignments/<int:job_id>/progress/",
        views.AgentProgressView.as_view(),
        name="agent-progress",
    ),
    path(
        "agent/assignments/<int:job_id>/submissions/",
        views.AgentSubmissionView.as_view(),
        name="agent-submissions",
    ),
    path(
        "agent/assignments/<int:job_id>/alignment/",
        views.AgentAlignmentView.as_view(),
        name="agent-alignment",
    ),
    path(
        "agent/assignments/<int:job_id>/leakage/",
        views.AgentLeakageView.as_view(),
        name="agent-leakage",
    ),
    path(
        "agent/assignments/<int:job_id>/evaluation-problems/",
        views.AgentEvaluationProblemView.as_view(),
        name="agent-evaluation-problems",
    ),
    path(
        "agent/assignments/<int:job_id>/vertical-predictions/",
        views.AgentVerticalPredictionView.as_view(),
        name="agent-vertical-predictions",
    ),
    path(
        "agent/assignments/<int:job_id>/inference/",
        views.AgentInferenceView.as_view(),
        name="agent-inference",
    ),
    path(
        "agent/assignments/<int:job_id>/privacy/",
        views.AgentPrivacyView.as_view(),
        name="agent-privacy",
    ),
    path(
        "agent/assignments/<int:job_id>/problems/",
        views.AgentProblemView.as_view(),
        name="agent-problems",
    ),
]
