from django.urls import path

from exports.api import views

urlpatterns = [
    path("jobs/<int:job_id>/exports/", views.ExportCreateView.as_view(), name="export-create"),
    path(
        "agent/exports/<int:export_id>/approve/",
        views.AgentApproveView.as_view(),
        name="agent-export-approve",
    ),
    path(
        "agent/exports/<int:export_id>/refuse/",
        views.AgentRefuseView.as_view(),
        name="agent-export-refuse",
    ),
    path("agent/exports/<int:export_id>/", views.AgentExportView.as_view(), name="agent-export"),
    path(
        "agent/exports/<int:export_id>/key/",
        views.AgentExportKeyView.as_view(),
        name="agent-export-key",
    ),
    path(
        "agent/exports/<int:export_id>/parts/",
        views.AgentExportPartsView.as_view(),
        name="agent-export-parts",
    ),
    path(
        "agent/exports/<int:export_id>/parts/<slug:name>/",
        views.AgentExportPartView.as_view(),
        name="agent-export-part",
    ),
    path(
        "agent/exports/<int:export_id>/fetched/",
        views.AgentExportFetchedView.as_view(),
        name="agent-export-fetched",
    ),
]
